"""--nft in the drop point's program: the key of the nftables rule that dropped the packet, into META's nft.

nf_tables sends a drop's trace event from the packet's path before nf_hook_slow frees the packet, and the trace
socket's program (fcap.kernel.nftfilter) leaves the verdict's rule key and the packet's first header bytes in this
CPU's slot (layout.NFT_SLOT). At a netfilter drop (reason NETFILTER_DROP; any drop where the kernel has no
reasons) the program takes that key when the freed packet's network header begins with those bytes, and empties
the slot. It does so at DEVICE, before the filter: a drop the filter turns away takes its own verdict too and leaves
none behind for another packet."""

from __future__ import annotations

from bpf.asm import (ADD, DW, FP, H, JEQ, JGT, JNE, R0, R1, R2, R3, R6, R7, R8, R9, W, addi, alu64, atomic_add, call,
                     ja, jmp, label, ld_map_fd, ldx, mov, movi, st)
from bpf.uapi import Helper

from fcap.kernel import drops
from fcap.kernel.layout import META, NFT_HDR, NFT_SLOT, STACK
from fcap.kernel.parts import DEVICE, MapUse, Part

NETFILTER_DROP = "SKB_DROP_REASON_NETFILTER_DROP"


def netfilter_reason(point) -> int | None:
    """The value of the NETFILTER_DROP reason where the point's records have a reason, else None (any drop)."""
    if not point.kind.multi and drops.reason_arg(point) is None:
        return None
    enum = drops.reason_enum(point.btf.root)
    return None if enum is None else enum.values.get(NETFILTER_DROP)


def _slot(b, done: str) -> list:
    """R0 = this CPU's slot; none: to `done`."""
    return [st(W, FP, STACK.tmp, 0), ld_map_fd(R1, b.maps.nftslot), mov(R2, FP), addi(R2, STACK.tmp),
            call(Helper.map_lookup_elem), jmp(JEQ, R0, 0, done)]


def emit(b) -> None:
    done, unmatched = b.fresh("nft_done"), b.fresh("nft_unmatched")
    slot = _slot(b, done)
    b.emit(META.store_imm(R7, "nft", 0))
    reason = netfilter_reason(b.point)
    if reason is not None:
        b.emit(META.load(R0, R7, "reason"), jmp(JNE, R0, reason, done))
    b.read(DW, R8, R6, b.offsets.head)
    b.read(H, R9, R6, b.offsets.network)
    b.emit(alu64(ADD, R8, R9, reg=True), slot, NFT_SLOT.load(R2, R0, "drop_len"), jmp(JEQ, R2, 0, unmatched),
           jmp(JGT, R2, NFT_HDR, unmatched), [st(DW, FP, STACK.nft_hdr + j, 0) for j in range(0, NFT_HDR, 8)],
           mov(R1, FP), addi(R1, STACK.nft_hdr), mov(R3, R8), call(Helper.probe_read_kernel),
           jmp(JNE, R0, 0, unmatched), slot)
    for j in range(0, NFT_HDR, 8):
        b.emit(ldx(DW, R1, FP, STACK.nft_hdr + j), ldx(DW, R2, R0, NFT_SLOT.off("drop_hdr") + j),
               jmp(JNE, R1, R2, unmatched, reg=True))
    b.emit(NFT_SLOT.load(R1, R0, "drop_rule"), META.store(R7, "nft", R1), NFT_SLOT.store_imm(R0, "drop_len", 0),
           ja(done), label(unmatched))
    if reason is not None:   # (a netfilter drop for sure: counted)
        b.emit(slot, movi(R1, 1), atomic_add(DW, R0, NFT_SLOT.off("unmatched"), R1))
    b.emit(label(done))


def _on(point, options, maps) -> bool:
    return bool(maps.nftslot) and (point.kind.multi or drops.is_drop_point(point))


NFT_VERDICT = Part("nft verdict", on=_on, stages={DEVICE: emit}, fields=("nft",),
                   maps=(MapUse("nftslot", "PERCPU_ARRAY, one NFT_SLOT: what the trace socket's program leaves "
                                           "(fcap.kernel.nftfilter)"),),
                   reads="fcap.features.nft_rule.NftRules")
