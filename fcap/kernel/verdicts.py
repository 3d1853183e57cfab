"""What a BPF program decided: at the exit of an XDP or tc program (kinds xdp.exit, tc.exit) the program records its
return value, which the pcapng block carries as epb_verdict (Wireshark: frame.verdict.ebpf_xdp / ebpf_tc) and the
comment, the JSON and the API name (XDP_DROP, TC_ACT_SHOT, ...)."""

from __future__ import annotations

from bpf.asm import DW, FP, R0, R7, ldx

from fcap.files.pcapfile import VERDICT_TC, VERDICT_XDP, verdict_name
from fcap.kernel.parts import RECORD_META, Part
from fcap.kernel.layout import META, STACK


# What the comment of a record at a BPF program's exit adds (after a drop's keys), declared as it is: (text before,
# attribute, style); Wireshark's field fcap.verdict_name


def records_verdict(point) -> bool:
    """Does the point's program record a verdict (the exit of a BPF program)?"""
    return point.kind.on_program and point.kind.sees_return


def verdict_type(point) -> int:
    """The epb_verdict type of the point's verdicts: eBPF XDP or eBPF TC."""
    return VERDICT_TC if point.kind.on_skb else VERDICT_XDP


def name(point, value: int) -> str:
    """XDP_DROP, TC_ACT_SHOT, ...; the number where it has no name."""
    return verdict_name(verdict_type(point), value)


def emit(b) -> None:
    """META's verdict = the program's return value (the context's slot past its arguments)."""
    b.emit(ldx(DW, R0, FP, STACK.ctx), ldx(DW, R0, R0, 8 * len(b.point.params)), META.store(R7, "verdict", R0))


VERDICT = Part("verdict", on=lambda point, options, maps: records_verdict(point), stages={RECORD_META: emit},
                  fields=("verdict",), reads="fcap.features.prog_verdict.VerdictNames")
