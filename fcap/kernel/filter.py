"""tcpdump filter expressions compiled by libpcap's own compiler (pcapy-ng) into cBPF for a capture's linktype."""

from __future__ import annotations

from fcap.files.linktypes import LinkType, dlt_for_libpcap
from fcap.errors import FilterError


def compile_filter(expr: str, linktype: LinkType, snaplen: int,
                   optimize: bool = True) -> list[tuple[int, int, int, int]]:
    """The cBPF instructions libpcap makes of `expr` for packets of `linktype`."""
    try:
        import pcapy
    except ImportError as e:  # pragma: no cover - pcapy-ng is a dependency
        raise FilterError(f"filters need pcapy-ng (libpcap's compiler): {e}") from None
    try:
        prog = pcapy.compile(dlt_for_libpcap(linktype), snaplen, expr, int(optimize), 0xFFFFFFFF)
    except pcapy.PcapError as e:
        raise FilterError(str(e)) from None
    from bpf.cbpf import CBPFError, validate
    try:   # what the translation refuses whatever the point (what depends on the point, building says)
        return validate([tuple(int(x) for x in ins) for ins in prog.get_bpf()])
    except CBPFError as e:
        raise FilterError(f"libpcap's program for it cannot run in fcap: {e}") from None


def format_cbpf(insns: list[tuple[int, int, int, int]]) -> str:
    """cBPF in tcpdump -d style."""
    from bpf import cbpf
    return cbpf.disassemble(insns)
