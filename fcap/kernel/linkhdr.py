"""The capture program's link header part (a part of fcap.kernel.program's Builder): where the linktype's bytes
start in the skb, a made-up link header where the skb has none (a zero Ethernet header, LINUX_SLL2's), and the
header bytes that lie before skb->data copied after META. Its labels come from the builder's fresh()."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bpf import asm
from bpf.asm import (ADD, DW, FP, JEQ, JGT, JNE, R0, R1, R2, R3, R6, R7, R8, R9, SUB, B, H, W, addi, alu64, andi,
                     call, jmp, label, ldx, mov, movi, st, stx)
from bpf.uapi import Helper

from fcap.kernel.layout import FLAG_MAC_SYNTH, META, PKT, PREFIX_MAX, START_MAC, START_NETWORK, START_SLL2, STACK

if TYPE_CHECKING:
    from fcap.kernel.program import Builder

SLL2_LEN, ETH_LEN = 20, 14


def headers(b: Builder) -> None:
    """Work out where this linktype's bytes start, write a made-up link header if one is needed and copy the
    header bytes that lie before skb->data. Leaves hdr_total in meta and in R8, skip in meta."""
    f, o = b.offsets, b.options
    start_data, start_set, done = b.fresh("start_data"), b.fresh("start_set"), b.fresh("hdr_done")
    # R8 = data offset (data - head), R9 = start offset; head kept in the stack tmp slot
    b.read(DW, R8, R6, f.data)
    b.read(DW, R9, R6, f.head)
    b.emit(stx(DW, FP, STACK.head, R9), alu64(SUB, R8, R9, reg=True), stx(DW, FP, STACK.dataoff, R8))
    synth = 0
    b.emit(META.store_imm(R7, "skip", 0))
    if o.start == START_SLL2:
        sll2(b)
        synth = SLL2_LEN
        b.read(H, R9, R6, f.network)
        b.emit(jmp(JEQ, R9, 0xFFFF, start_data))
    elif o.start == START_MAC:
        b.read(H, R9, R6, f.mac)
        b.emit(jmp(JNE, R9, 0xFFFF, start_set))
        # no MAC header yet: make up an Ethernet header (zero addresses, the skb's protocol)
        b.emit(st(DW, R7, PKT, 0), st(W, R7, PKT + 8, 0), META.load(R0, R7, "proto"),
               stx(H, R7, PKT + 12, R0), META.store_imm(R7, "flags", FLAG_MAC_SYNTH))
        b.read(H, R9, R6, f.network)
        synth_data = b.fresh("start_data_synth")
        b.emit(jmp(JEQ, R9, 0xFFFF, synth_data))
        copy_prefix(b, ETH_LEN)
        b.emit(asm.ja(done), label(synth_data), movi(R8, ETH_LEN), META.store(R7, "hdr", R8), asm.ja(done))
    elif o.start == START_NETWORK:
        b.read(H, R9, R6, f.network)
        b.emit(jmp(JEQ, R9, 0xFFFF, start_data))
    else:
        b.emit(asm.ja(start_data))
    b.emit(label(start_set))
    copy_prefix(b, synth)
    if o.start != START_MAC:  # (the MAC start has its own fallback above)
        b.emit(asm.ja(done), label(start_data), movi(R8, synth), META.store(R7, "hdr", R8))
    b.emit(label(done))


def copy_prefix(b: Builder, synth: int) -> None:
    """R8 = data offset, R9 = start offset: copy [start, data) after `synth` made-up bytes, or note skip."""
    skip, done, toolong, empty = (b.fresh(n) for n in ("skip", "prefix_done", "toolong", "empty"))
    b.emit(jmp(JGT, R9, R8, skip, reg=True),
           # prefix = data - start, bounded
           mov(R2, R8), alu64(SUB, R2, R9, reg=True), jmp(JGT, R2, PREFIX_MAX, toolong),
           mov(R8, R2),   # R8 = prefix length from here on
           jmp(JEQ, R2, 0, empty),
           mov(R1, R7), addi(R1, PKT + synth), ldx(DW, R3, FP, STACK.head), alu64(ADD, R3, R9, reg=True),
           call(Helper.probe_read_kernel),
           label(empty), addi(R8, synth), META.store(R7, "hdr", R8), asm.ja(done),
           label(toolong), movi(R8, synth), META.store(R7, "hdr", R8), asm.ja(done),
           # start lies past data: the first (start - data) bytes of the skb's data are not ours
           label(skip), mov(R2, R9), alu64(SUB, R2, R8, reg=True), andi(R2, 0xFFFF),
           META.store(R7, "skip", R2), movi(R8, synth), META.store(R7, "hdr", R8),
           label(done))


def sll2(b: Builder) -> None:
    """The 20-byte LINUX_SLL2 header, from the skb's metadata (address: the MAC source when present)."""
    f = b.offsets
    noaddr = b.fresh("sll2_noaddr")
    b.emit(META.load(R0, R7, "proto"), stx(H, R7, PKT, R0), st(H, R7, PKT + 2, 0),
           META.load(R0, R7, "ifindex"), asm.be(R0, 32), stx(W, R7, PKT + 4, R0),
           META.load(R0, R7, "hatype"), asm.be(R0, 16), stx(H, R7, PKT + 8, R0),
           META.load(R0, R7, "pkt_type"), stx(B, R7, PKT + 10, R0), st(B, R7, PKT + 11, 0),
           st(DW, R7, PKT + 12, 0))
    b.read(H, R9, R6, f.mac)
    b.emit(jmp(JEQ, R9, 0xFFFF, noaddr), st(B, R7, PKT + 11, 6),
           mov(R1, R7), addi(R1, PKT + 12), movi(R2, 6), ldx(DW, R3, FP, STACK.head),
           alu64(ADD, R3, R9, reg=True), addi(R3, 6), call(Helper.probe_read_kernel), label(noaddr))
