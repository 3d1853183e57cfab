"""The capture program at an XDP program's entry or exit (kinds xdp.entry, xdp.exit): the context is a struct
xdp_buff, not an skb. The packet is [data, data_end), read with probe_read_kernel into the scratch value and handed
to the perf buffer as an untyped point's bytes; a multi-buffer packet (an xdp.frags program's, Linux 5.18+: jumbo
frames, LRO) has frags after it, which bpf_xdp_output appends to the record instead (the packet's length counts
them). The device is xdp->rxq->dev, the direction in (PACKET_HOST), no mark. The rest of the program (predicates,
filter, record) is the skb program's (fcap.kernel.program.Builder)."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from bpf import asm
from bpf.asm import (ADD, DW, FP, JEQ, JLT, R0, R1, R2, R3, R6, R7, R8, R9, SUB, H, W, addi, alu64, andi, be, call,
                     jmp, label, ldx, mov, movi, st, stx)
from bpf.btf import BTF
from bpf.errors import BTFError
from bpf.cbpf import ANCILLARY, CBPFError
from bpf.uapi import Helper

from fcap.files.linktypes import PACKET_HOST
from fcap.kernel import perfrec
from fcap.kernel.parts import DEVICE
from fcap.kernel.layout import META, PKT, START_NETWORK, START_SLL2, STACK
from fcap.kernel.program import Builder

ETH_HLEN = 14
ADDR_AT = 6            # the Ethernet source address: SLL2's address
PROTO_AT = 12          # the EtherType


SMP_CACHE_BYTES = 64   # SKB_DATA_ALIGN's alignment (L1_CACHE_BYTES on x86-64 and arm64)


class XdpFrags(NamedTuple):
    """Where a multi-buffer xdp_buff says it has frags and how many bytes they hold: xdp->flags & has_frags; the
    struct skb_shared_info at data_hard_start + frame_sz - sinfo (its size, SKB_DATA_ALIGN'ed), its xdp_frags_size
    at frags_size."""

    flags: int
    has_frags: int
    hard_start: int
    frame_sz: int
    sinfo: int
    frags_size: int


class XdpOffsets:
    """Where struct xdp_buff and struct xdp_rxq_info hold what the program reads, from BTF; frags: None before
    multi-buffer XDP (Linux 5.18)."""

    def __init__(self, vm: BTF):
        xdp, rxq = vm.find("xdp_buff", "struct"), vm.find("xdp_rxq_info", "struct")
        self.data = xdp.member("data")[1] // 8
        self.data_end = xdp.member("data_end")[1] // 8
        self.rxq = xdp.member("rxq")[1] // 8
        self.rxq_dev = rxq.member("dev")[1] // 8
        self.frags = _frags(vm, xdp)


def _frags(vm: BTF, xdp) -> XdpFrags | None:
    flags, sinfo = vm.find("xdp_buff_flags", "enum"), vm.find("skb_shared_info", "struct")
    if flags is None or sinfo is None or "XDP_FLAGS_HAS_FRAGS" not in flags.values:
        return None
    try:
        return XdpFrags(xdp.member("flags")[1] // 8, flags.values["XDP_FLAGS_HAS_FRAGS"],
                        xdp.member("data_hard_start")[1] // 8, xdp.member("frame_sz")[1] // 8,
                        -(-sinfo.size // SMP_CACHE_BYTES) * SMP_CACHE_BYTES, sinfo.member("xdp_frags_size")[1] // 8)
    except BTFError:
        return None


@lru_cache(maxsize=2)
def xdp_offsets(vm: BTF) -> XdpOffsets:
    return XdpOffsets(vm)


class XdpBuilder(Builder):
    """A Builder whose R6 is the struct xdp_buff (R7 the scratch value as ever)."""

    def __init__(self, point, opts, maps):
        super().__init__(point, opts, maps)
        self.xdp = xdp_offsets(point.btf.root)

    def device(self, dst: int) -> None:
        """dst = xdp->rxq->dev (NULL loads give 0: the pointers are BTF-typed)."""
        self.emit(ldx(DW, dst, R6, self.xdp.rxq), ldx(DW, dst, dst, self.xdp.rxq_dev))

    def nonlinear_len(self, dst: int) -> None:
        """dst = the bytes in a multi-buffer packet's frags: META's len less data_end - data (uses R1)."""
        if self.xdp.frags is None:
            self.emit(movi(dst, 0))
            return
        assert dst != R1
        self.emit(ldx(DW, dst, R6, self.xdp.data_end), ldx(DW, R1, FP, STACK.head), alu64(SUB, dst, R1, reg=True),
                  META.load(R1, R7, "len"), alu64(SUB, R1, dst, reg=True), mov(dst, R1))

    def frags_len(self) -> None:
        """R9 += the bytes in the packet's frags, where it has them (skb_shared_info's xdp_frags_size). Uses R0-R5."""
        fr = self.xdp.frags
        if fr is None:
            return
        linear = self.fresh("xdp_linear")
        self.emit(ldx(W, R0, R6, fr.flags), andi(R0, fr.has_frags), jmp(JEQ, R0, 0, linear),
                  ldx(DW, R3, R6, fr.hard_start), ldx(W, R0, R6, fr.frame_sz), alu64(ADD, R3, R0, reg=True),
                  addi(R3, fr.frags_size - fr.sinfo), mov(R1, FP), addi(R1, STACK.tmp), movi(R2, 4),
                  st(DW, FP, STACK.tmp, 0), call(Helper.probe_read_kernel), ldx(W, R0, FP, STACK.tmp),
                  alu64(ADD, R9, R0, reg=True), label(linear))

    def perf_output(self, events: int = 0) -> None:
        """A linear packet's bytes read by the program (as ever); a multi-buffer one's, frags too, appended by
        bpf_xdp_output. In: R2 = copy, R8 = hdr_total."""
        fr = self.xdp.frags
        if fr is None:
            super().perf_output(events)
            return
        linear, sent = self.fresh("xdp_copied"), self.fresh("xdp_sent")
        self.emit(ldx(W, R0, R6, fr.flags), andi(R0, fr.has_frags), jmp(JEQ, R0, 0, linear))
        perfrec.output_by_helper(self, Helper.xdp_output, events)
        self.emit(asm.ja(sent), label(linear))
        perfrec.output_copied(self, events)
        self.emit(label(sent))

    def skb_mark(self, dst: int) -> None:
        self.emit(movi(dst, 0))

    def metadata(self) -> None:
        """META's address (the xdp_buff's), len = data_end - data, the EtherType, PACKET_HOST, the device; data
        kept at STACK.head (STACK.dataoff 0), where the copies read from."""
        x, f = self.xdp, self.offsets
        self.emit(META.store(R7, "skb", R6), ldx(DW, R8, R6, x.data), ldx(DW, R9, R6, x.data_end),
                  stx(DW, FP, STACK.head, R8), st(DW, FP, STACK.dataoff, 0), alu64(SUB, R9, R8, reg=True))
        self.frags_len()
        proto, no_dev = self.fresh("xdp_proto"), self.fresh("no_dev")
        self.emit(META.store(R7, "len", R9), movi(R0, 0), jmp(JLT, R9, ETH_HLEN, proto),
                  mov(R1, FP), addi(R1, STACK.tmp), movi(R2, 2), mov(R3, R8), addi(R3, PROTO_AT),
                  st(DW, FP, STACK.tmp, 0), call(Helper.probe_read_kernel), ldx(H, R0, FP, STACK.tmp),
                  label(proto), META.store(R7, "proto", R0), META.store_imm(R7, "pkt_type", PACKET_HOST),
                  self.store_point_id(R7, "point", R0), META.store_imm(R7, "flags", 0),
                  META.store_imm(R7, "ifindex", 0), META.store_imm(R7, "hatype", 0), META.store_imm(R7, "netns", 0))
        if not (self.options.meta or self.options.start == START_SLL2):
            return
        self.device(R8)
        self.emit(jmp(JEQ, R8, 0, no_dev))
        self._read_store(R8, f.ifindex, "ifindex")
        self._read_store(R8, f.hatype, "hatype")
        self.emit(label(no_dev))
        self.stage(DEVICE)

    def headers(self) -> None:
        """The bytes start at data (EN10MB); RAW/IPV4/IPV6 skip the Ethernet header; LINUX_SLL2 puts its header
        first (the source address from the Ethernet header) and skips it. Leaves R8 = hdr_total."""
        start = self.options.start
        skip = ETH_HLEN if start in (START_NETWORK, START_SLL2) else 0
        self.emit(META.store_imm(R7, "skip", skip))
        if start == START_SLL2:
            noaddr = self.fresh("sll2_noaddr")
            self.emit(META.load(R0, R7, "proto"), stx(H, R7, PKT, R0), st(H, R7, PKT + 2, 0),
                      META.load(R0, R7, "ifindex"), be(R0, 32), stx(W, R7, PKT + 4, R0),
                      META.load(R0, R7, "hatype"), be(R0, 16), stx(H, R7, PKT + 8, R0),
                      st(H, R7, PKT + 10, 6 << 8), st(DW, R7, PKT + 12, 0),
                      META.load(R9, R7, "len"), jmp(JLT, R9, ETH_HLEN, noaddr),
                      mov(R1, R7), addi(R1, PKT + 12), movi(R2, 6), ldx(DW, R3, FP, STACK.head), addi(R3, ADDR_AT),
                      call(Helper.probe_read_kernel), label(noaddr))
        self.emit(movi(R8, 20 if start == START_SLL2 else 0), META.store(R7, "hdr", R8))

    def mark_and_netns(self) -> None:
        """No sk_buff at XDP (its copied fields are 0: mark, ...); the network namespace of xdp->rxq->dev."""
        f = self.offsets
        self.emit([META.store_imm(R7, field, 0) for field in f.copied])
        if f.net_inum is None:
            return
        no_netns = self.fresh("no_netns")
        self.device(R8)
        self.emit(jmp(JEQ, R8, 0, no_netns), ldx(DW, R8, R8, f.dev_net), jmp(JEQ, R8, 0, no_netns))
        self._read_store(R8, f.net_inum, "netns")
        self.emit(label(no_netns))

    def ancillary_load(self, field: int, dst: int, reject: str) -> list:
        """The ancillary fields an XDP packet has: inbound (always), the CPU, a random number, ifindex and the
        EtherType; the others are the skb's."""
        name = ANCILLARY[field]
        if field == 4:
            return [movi(dst, 0)]
        if field == 36:
            return [call(Helper.get_smp_processor_id), mov(dst, R0)]
        if field == 56:
            return [call(Helper.get_prandom_u32), mov(dst, R0)]
        if field == 0:   # the EtherType the metadata read
            return [ldx(DW, R1, FP, STACK.scratch), META.load(dst, R1, "proto"), be(dst, 16)]
        if field == 8:   # xdp->rxq->dev->ifindex (the xdp_buff saved at STACK.skb while the filter runs)
            return [ldx(DW, R1, FP, STACK.skb), ldx(DW, R1, R1, self.xdp.rxq), ldx(DW, R1, R1, self.xdp.rxq_dev),
                    jmp(JEQ, R1, 0, reject), ldx(W, dst, R1, self.offsets.ifindex)]
        raise CBPFError(f"Linux ancillary field {name}: an XDP packet has no skb to hold it")
