"""The capture program's perf buffer record (a part of fcap.kernel.program's Builder): the file's record header
laid out at the end of META (pcap's, or pcapng's Enhanced Packet Block's), then META, the made-up and header bytes
and the packet's bytes handed to the perf buffer: appended by bpf_skb_output/bpf_xdp_output (frags too), or read by
the program itself where the point gives no skb the helper takes. fcap.live.drain.FileDrain reads them. Its labels
come from the builder's fresh(), but for the program's exit ("out")."""

from __future__ import annotations

from operator import methodcaller
from typing import TYPE_CHECKING

from bpf import asm
from bpf.asm import (ADD, DW, FP, JEQ, JGE, JGT, JNE, JSGT, OR, R0, R1, R2, R3, R4, R5, R6, R7, R8, SUB, addi, alu64,
                     andi, call, jmp, label, ld_imm64, ld_map_fd, ldx, lshi, mov, movi, rshi, stx)
from bpf.uapi import F_CURRENT_CPU, Helper

from fcap.defaults import NS
from fcap.kernel import ringrec
from fcap.kernel.parts import WRITE, Part, MapUse
from fcap.kernel.layout import HDR_MAX, LINEAR_CAP, META, META_SIZE, PCAPNG_EPB, PKT, RECORD_PCAPNG, STACK
from fcap.kernel.progopts import Maps, ProgramOptions, dump_area
from fcap.points.spec import Point

if TYPE_CHECKING:
    from fcap.kernel.program import Builder


def perf_output(b: Builder, events: int = 0) -> None:
    """Hand the record to the perf buffer (`events`' fd; 0: the session's maps.events): meta + headers from
    scratch, the skb's bytes (frags too) after. In: R2 = copy, R8 = hdr_total. Out: R0 = the output's result."""
    if b.copies_bytes:
        output_copied(b, events)
    else:
        output_by_helper(b, Helper.skb_output, events)


def file_header(b: Builder) -> None:
    """The capture file's record header at the end of META. In: R4 = caplen, R8 = hdr_total. Uses R0, R1, R3,
    R5; keeps R2, R4, R8. The original length counts from the linktype's start: hdr + max(len - skip, 0)."""
    pos = b.fresh("orig_pos")
    b.emit(META.store(R7, "caplen", R4), META.load(R5, R7, "len"), META.load(R3, R7, "skip"),
           alu64(SUB, R5, R3, reg=True), jmp(JSGT, R5, 0, pos), movi(R5, 0), label(pos),
           alu64(ADD, R5, R8, reg=True), META.store(R7, "orig", R5),
           META.load(R0, R7, "ts"), ld_imm64(R1, b.options.clock_offset_ns), alu64(ADD, R0, R1, reg=True))
    if b.options.record == RECORD_PCAPNG:
        # nanosecond units (the writer's if_tsresol 9), high word first; total = 32 + caplen padded to 4
        b.emit(META.store(R7, "ts2", R0), rshi(R0, 32), META.store(R7, "ts1", R0),
               META.store_imm(R7, "btype", PCAPNG_EPB), b.store_point_id(R7, "iface", R1),
               mov(R1, R4), addi(R1, 32 + 3), andi(R1, -4), META.store(R7, "total", R1))
    else:
        b.emit(mov(R1, R0), alu64(asm.DIV, R1, NS), META.store(R7, "ts1", R1), alu64(asm.MUL, R1, NS),
               alu64(SUB, R0, R1, reg=True), META.store(R7, "ts2", R0))


def output_by_helper(b: Builder, helper: Helper, events: int = 0) -> None:
    """The packet's bytes appended by `helper` (bpf_skb_output, bpf_xdp_output: frags too) to meta + headers,
    copy bytes from the packet's first (skip included: user space drops them)."""
    area = dump_area(b.options)
    # caplen = hdr + max(copy - skip, 0); contiguous (FAST) only when skip == 0
    pos, fast = b.fresh("cap_pos"), b.fresh("fast_set")
    b.emit(META.store(R7, "copy", R2), META.load(R3, R7, "skip"), mov(R4, R2), alu64(SUB, R4, R3, reg=True),
           jmp(JSGT, R4, 0, pos), movi(R4, 0), label(pos), alu64(ADD, R4, R8, reg=True),
           META.store(R7, "fast", R4), jmp(JEQ, R3, 0, fast), META.store_imm(R7, "fast", 0), label(fast))
    file_header(b)
    b.emit(mov(R3, R2), lshi(R3, 32), ld_imm64(R0, F_CURRENT_CPU), alu64(OR, R3, R0, reg=True),
           mov(R1, R6), ld_map_fd(R2, events or b.maps.events), mov(R4, R7), [addi(R4, -area)] if area else [],
           mov(R5, R8), addi(R5, META_SIZE + area), call(helper))


def output_copied(b: Builder, events: int = 0) -> None:
    """The packet's linear bytes read by the program into scratch after meta + headers, handed over whole."""
    area = dump_area(b.options)
    sub, have, pos, less, cap, over, go = (b.fresh(n) for n in ("lin_sub", "lin_have", "lin2_pos", "lin2_min",
                                                               "lin2_cap", "lin2_max", "lin2_go"))
    # linear bytes only: n = min(copy - skip, headlen - skip, LINEAR_CAP), read into scratch after the headers
    b.emit(META.load(R3, R7, "skip"), jmp(JGE, R2, R3, sub, reg=True), movi(R2, 0),
           asm.ja(have), label(sub), alu64(SUB, R2, R3, reg=True), label(have),
           stx(DW, FP, STACK.n, R2))
    b.nonlinear_len(R0)
    b.emit(META.load(R3, R7, "len"), alu64(SUB, R3, R0, reg=True), META.load(R4, R7, "skip"),
           alu64(SUB, R3, R4, reg=True), ldx(DW, R2, FP, STACK.n),
           jmp(JSGT, R3, 0, pos), movi(R3, 0), label(pos),
           jmp(JGT, R2, R3, less, reg=True), asm.ja(cap), label(less), mov(R2, R3),
           label(cap), jmp(JGT, R2, LINEAR_CAP, over), asm.ja(go),
           label(over), movi(R2, LINEAR_CAP), label(go),
           META.store(R7, "copy", R2), stx(DW, FP, STACK.n, R2),
           # the bytes are read into place after the headers: always contiguous
           mov(R4, R2), alu64(ADD, R4, R8, reg=True), META.store(R7, "fast", R4))
    file_header(b)
    b.emit(ldx(DW, R2, FP, STACK.n),
           mov(R1, R7), addi(R1, PKT), alu64(ADD, R1, R8, reg=True),
           ldx(DW, R3, FP, STACK.head), ldx(DW, R4, FP, STACK.dataoff), alu64(ADD, R3, R4, reg=True),
           META.load(R4, R7, "skip"), alu64(ADD, R3, R4, reg=True), META.store_imm(R7, "skip", 0),
           call(Helper.probe_read_kernel), jmp(JNE, R0, 0, "out"),
           ldx(DW, R1, FP, STACK.ctx), ld_map_fd(R2, events or b.maps.events), ld_imm64(R3, F_CURRENT_CPU),
           mov(R4, R7), [addi(R4, -area)] if area else [], ldx(DW, R5, FP, STACK.n),
           alu64(ADD, R5, R8, reg=True), addi(R5, META_SIZE + area),
           jmp(JGT, R5, area + META_SIZE + HDR_MAX + LINEAR_CAP, "out"),
           call(Helper.perf_event_output))


def _perf_buffer(point: Point, options: ProgramOptions, maps: Maps) -> bool:
    return not ringrec.writes_ring(point, options, maps)


# (the builder's own perf_output: XdpBuilder's appends a multi-buffer packet's frags)
PERF_OUTPUT = Part("perf buffer", on=_perf_buffer, stages={WRITE: methodcaller("perf_output")},
                      fields=("copy", "fast", "caplen", "orig", "ts1", "ts2"),
                      maps=(MapUse("events", "PERF_EVENT_ARRAY, a buffer per CPU; the session's"),),
                      reads="fcap.live.drain.FileDrain")
