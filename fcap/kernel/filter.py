"""The filter: tcpdump's expression compiled by libpcap's own compiler (pcapy-ng) into cBPF for a capture's link
type, and the capture program's part that runs it (translated to eBPF) over the packet's first bytes."""

from __future__ import annotations

from functools import partial

from bpf import asm
from bpf.asm import (ADD, DW, FP, JEQ, JGE, JGT, JNE, JSGT, JSLT, OR, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, SUB, W,
                     addi, alu64, call, jmp, label, ld_imm64, ldx, mov, movi, stx)
from bpf.uapi import Helper

from fcap.errors import FilterError
from fcap.files.linktypes import LinkType, dlt_for_libpcap
from fcap.kernel.parts import FILTER, Part
from fcap.kernel.layout import FILTER_CAP, FLAG_LINEAR_ONLY, HDR_MAX, LINEAR_CAP, META, PKT, STACK

IN_PLACE_MAX = 6000   # cBPF instructions: a filter the program may hold twice (in place and over the copy)


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


def run(b) -> None:
    """Run the translated cBPF filter over the packet's first bytes: in place through skb->head where the
    verifier allows direct loads there and those bytes are linear with nothing made up before them, else over
    a copy in scratch."""
    o = b.options
    # R8 = hdr_total. Bytes wanted: min(len - skip, FILTER_CAP or LINEAR_CAP)
    cap = FILTER_CAP if b.point.typed else LINEAR_CAP
    f = b.fresh_names("flt", "len_ok", "have_len", "cap", "copy", "copy_in", "buf", "done", "lin_pos", "lin_min",
                      "lin_go")
    b.emit(META.load(R8, R7, "hdr"), META.load(R2, R7, "len"), META.load(R3, R7, "skip"),
              jmp(JGE, R2, R3, f.len_ok, reg=True), movi(R2, 0), asm.ja(f.have_len),
              label(f.len_ok), alu64(SUB, R2, R3, reg=True), label(f.have_len),
              # wirelen (cBPF's len) = hdr + len - skip, kept on the stack
              mov(R0, R2), alu64(ADD, R0, R8, reg=True), stx(DW, FP, STACK.wirelen, R0),
              jmp(JGT, R2, cap, f.cap), asm.ja(f.copy), label(f.cap), movi(R2, cap),
              label(f.copy), stx(DW, FP, STACK.scratch, R7))
    slow = bool(o.dynptr_kfunc and b.point.typed)
    # (in place, the filter is translated twice: not for a filter so long that two would put the program's
    # jumps out of reach)
    in_place = o.head_loads and b.point.typed and len(o.filter) <= IN_PLACE_MAX
    if in_place:
        _in_place(b, f)
    if slow:
        # bpf_dynptr_from_skb(skb, 0, &dynptr); bpf_dynptr_read(dst, n, &dynptr, skip, 0): frags included
        b.emit(stx(DW, FP, STACK.n, R2), mov(R1, R6), movi(R2, 0), mov(R3, FP), addi(R3, STACK.dynptr),
                  asm.kfunc_call(o.dynptr_kfunc),
                  ldx(DW, R2, FP, STACK.n), jmp(JNE, R0, 0, "out"),
                  jmp(JGT, R8, HDR_MAX, "out"), mov(R1, R7), addi(R1, PKT), alu64(ADD, R1, R8, reg=True),
                  mov(R3, FP), addi(R3, STACK.dynptr), META.load(R4, R7, "skip"), movi(R5, 0),
                  call(Helper.dynptr_read), jmp(JNE, R0, 0, "out"), ldx(DW, R2, FP, STACK.n))
    else:
        # linear data only: n = min(n, headlen - skip), read from data + skip
        b.emit(stx(DW, FP, STACK.n, R2))
        b.nonlinear_len(R0)
        b.emit(META.load(R3, R7, "len"), alu64(SUB, R3, R0, reg=True), META.load(R4, R7, "skip"),
                  alu64(SUB, R3, R4, reg=True), ldx(DW, R2, FP, STACK.n),
                  jmp(JSGT, R3, 0, f.lin_pos), movi(R3, 0), label(f.lin_pos),
                  jmp(JGT, R2, R3, f.lin_min, reg=True), asm.ja(f.lin_go), label(f.lin_min), mov(R2, R3),
                  label(f.lin_go), META.load(R0, R7, "flags"), alu64(OR, R0, FLAG_LINEAR_ONLY),
                  META.store(R7, "flags", R0), stx(DW, FP, STACK.n, R2),
                  jmp(JGT, R8, HDR_MAX, "out"), jmp(JGT, R2, cap, "out"),
                  mov(R1, R7), addi(R1, PKT), alu64(ADD, R1, R8, reg=True),
                  ldx(DW, R3, FP, STACK.head), ldx(DW, R4, FP, STACK.dataoff), alu64(ADD, R3, R4, reg=True),
                  META.load(R4, R7, "skip"), alu64(ADD, R3, R4, reg=True),
                  call(Helper.probe_read_kernel), jmp(JNE, R0, 0, "out"), ldx(DW, R2, FP, STACK.n))
    b.emit(stx(DW, FP, STACK.skb, R6), mov(R6, R7), addi(R6, PKT))
    _translated(b, f, b.fresh("flt"), cap, slow)
    if in_place:
        # the same filter again, over the skb's own bytes: each load instruction then reads through one kind
        # of pointer on every path (the copy's map value, or skb->head's untrusted memory), as every verifier
        # asks (6.18.44 builds refuse a load that both reach; bpf.ptrkinds checks it before loading)
        b.emit(asm.ja(f.done), label(f.buf))
        _translated(b, f, b.fresh("flti"), cap, slow)
    b.emit(label(f.done), ldx(DW, R7, FP, STACK.scratch), ldx(DW, R6, FP, STACK.skb),
              jmp(JEQ, R0, 0, "out"))

def _translated(b, f, prefix: str, cap: int, slow: bool) -> None:
    """The cBPF filter over the buffer at R6 (R2 = bytes wanted, R8 = hdr_total), its verdict in R0 at f.done (its
    own labels named from `prefix`, a fresh() name). buflen: what cBPF loads are checked against = the captured
    length, min(wirelen, snaplen) where the slow path reaches every byte (skb dynptr); else only the bytes in the
    buffer, min(hdr + n, snaplen)."""
    from bpf import cbpf  # the translator is optional until a filter is asked for
    o = b.options
    snap, run = f"{prefix}_snap", f"{prefix}_run"
    if slow:
        b.emit(ldx(DW, R2, FP, STACK.wirelen))
    else:
        b.emit(alu64(ADD, R2, R8, reg=True))
    b.emit(jmp(JGT, R2, o.snaplen, snap), asm.ja(run),
              label(snap), movi(R2, o.snaplen) if o.snaplen < 2**31 else ld_imm64(R2, o.snaplen),
              label(run), mov(R8, R2), ldx(DW, R9, FP, STACK.wirelen))
    # capacity: the buffer bytes that hold the packet whenever buflen reaches them. With the slow path buflen
    # is the whole packet, but only [0, hdr + min(len - skip, cap)) is in the buffer: [0, cap) at least (hdr <=
    # HDR_MAX < cap), the rest from the slow path. Without it buflen = hdr + n bounds every load.
    model = cbpf.PacketModel(buf=R6, buflen=R8, wirelen=R9, capacity=cap if slow else HDR_MAX + cap,
                             slow_load=partial(_slow_load, b) if slow else None, ancillary=b.ancillary_load,
                             division_tracked=o.division_tracked)
    b.emit(cbpf.translate(o.filter, model, result=R0, done=f.done, prefix=prefix, stack_off=STACK.cbpf))

def _in_place(b, f) -> None:
    """When hdr == 0 and the n (R2) wanted bytes are linear: R6 = skb->head + data offset + skip (loads through
    it are checked by the JIT, not copied), skb saved, on to f.buf. Else on to the copy. Keeps R2, R8."""
    b.emit(jmp(JNE, R8, 0, f.copy_in),
              META.load(R0, R7, "len"), ldx(W, R1, R6, b.offsets.data_len), alu64(SUB, R0, R1, reg=True),
              META.load(R3, R7, "skip"), alu64(SUB, R0, R3, reg=True), jmp(JSLT, R0, R2, f.copy_in, reg=True),
              b.skb_head(R1), ldx(DW, R0, FP, STACK.dataoff), alu64(ADD, R1, R0, reg=True),
              alu64(ADD, R1, R3, reg=True), stx(DW, FP, STACK.skb, R6), mov(R6, R1), asm.ja(f.buf),
              label(f.copy_in))

def _slow_load(b, size: int, off_reg: int, dst: int, reject: str) -> list:
    """A load past the buffer's bytes: bpf_dynptr_read from the skb (offset relative to the capture start),
    through a dynptr made here (the in-place path made none)."""
    nbytes = asm.SIZE_BYTES.get(size, size)
    # packet offset → skb offset: off - hdr_total + skip (hdr bytes are all in the buffer)
    return [mov(R4, off_reg), ldx(DW, R5, FP, STACK.scratch), META.load(R0, R5, "hdr"),
            alu64(SUB, R4, R0, reg=True), jmp(JSLT, R4, 0, reject), META.load(R0, R5, "skip"),
            alu64(ADD, R4, R0, reg=True), stx(DW, FP, STACK.tmp, R4),
            ldx(DW, R1, FP, STACK.skb), movi(R2, 0), mov(R3, FP), addi(R3, STACK.dynptr),
            asm.kfunc_call(b.options.dynptr_kfunc), jmp(JNE, R0, 0, reject),
            mov(R1, FP), addi(R1, STACK.slow), movi(R2, nbytes), mov(R3, FP), addi(R3, STACK.dynptr),
            ldx(DW, R4, FP, STACK.tmp), movi(R5, 0), call(Helper.dynptr_read), jmp(JNE, R0, 0, reject),
            ldx(asm.BYTES_SIZE[nbytes], dst, FP, STACK.slow)]


PACKET_FILTER = Part("filter", on=lambda point, options, maps: options.filter is not None, stages={FILTER: run},
                        flags=(FLAG_LINEAR_ONLY,), turns_away=True)
