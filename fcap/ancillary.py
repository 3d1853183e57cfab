"""Linux's ancillary fields (cBPF's `ld [SKF_AD_OFF + n]`: inbound/outbound, ifindex, mark, ...) served to a
translated filter from the skb at a capture point, as Linux's socket filters see them."""

from __future__ import annotations

from functools import lru_cache

from bpf.asm import (NEG, B, DW, FP, JEQ, R0, R1, R2, R3, H, W, addi, alu64, andi, be, call, jmp, ldx, mov, mov32,
                     movi, rshi, st)
from bpf.btf import BTF
from bpf.cbpf import ANCILLARY, CBPFError
from bpf.uapi import Helper

PACKET_OUTGOING = 4
NBYTES = {B: 1, H: 2, W: 4, DW: 8}
# field → (sk_buff member, size, big-endian): the plain loads
SKB = {0: ("protocol", H, True), 12: ("mark", W, False), 16: ("queue_mapping", H, False), 32: ("hash", W, False),
       44: ("vlan_tci", H, False), 60: ("vlan_proto", H, True)}
DEV = {8: ("ifindex", W), 28: ("type", H)}   # through skb->dev (no device: the filter does not match)
REFUSED = {20: "netlink attributes exist only on netlink sockets",
           24: "netlink attributes exist only on netlink sockets",
           52: "the payload offset needs the kernel's flow dissector, which a capture program cannot call"}


class Offsets:
    """Byte offsets (and bit positions) of what the ancillary fields read, from this kernel's BTF."""

    def __init__(self, vm: BTF):
        skb, dev = vm.find("sk_buff", "struct"), vm.find("net_device", "struct")
        self.skb = {name: skb.member(name)[1] // 8 for name in ("dev", *(m for m, _, _ in SKB.values()))}
        self.dev = {name: dev.member(name)[1] // 8 for name, _ in DEV.values()}
        m, bits = skb.member("pkt_type")
        self.pkt_type = (bits // 8, bits % 8, (1 << (m.bitfield_size or 3)) - 1)
        self.vlan_all = self.vlan_present = None   # 6.2+: present = vlan_all != 0; before: a one-bit field
        try:
            self.vlan_all = skb.member("vlan_all")[1] // 8
        except Exception:  # noqa: BLE001 - an older layout
            try:
                bits = skb.member("vlan_present")[1]
                self.vlan_present = (bits // 8, bits % 8)
            except Exception:  # noqa: BLE001 - before 4.20 the tag's CFI bit said it (no tp_btf there)
                pass


@lru_cache(maxsize=4)
def offsets(vm: BTF) -> Offsets:
    return Offsets(vm)


def _read(typed: bool, size: int, dst: int, base: int, off: int, skb_slot: int, tmp_slot: int) -> list:
    """dst = *(size *)(base + off); base is R1. Untyped points go through probe_read_kernel (R1-R3 clobbered)."""
    if typed:
        return [ldx(size, dst, base, off)]
    return [mov(R3, base), addi(R3, off), mov(R1, FP), addi(R1, tmp_slot), movi(R2, NBYTES[size]),
            st(DW, FP, tmp_slot, 0), call(Helper.probe_read_kernel), ldx(size, dst, FP, tmp_slot)]


def load(point, field: int, dst: int, reject: str, skb_slot: int, tmp_slot: int) -> list:
    """Code loading ancillary field `field` into dst (a u32) for a filter at `point`; the skb pointer is in the
    stack at skb_slot. May clobber R0-R5. Raises CBPFError where the field means nothing at this point."""
    name = ANCILLARY[field]
    if field in REFUSED:
        raise CBPFError(f"Linux ancillary field {name}: {REFUSED[field]}")
    if field == 36:
        return [call(Helper.get_smp_processor_id)] + ([mov32(dst, R0)] if dst != R0 else [])
    if field == 56:
        return [call(Helper.get_prandom_u32)] + ([mov32(dst, R0)] if dst != R0 else [])
    if field == 4 and point.direction == "out":
        return [movi(dst, PACKET_OUTGOING)]   # what packet sockets see on transmit, whatever the skb says
    if field == 4 and point.direction is None:
        raise CBPFError(f"Linux ancillary field {name} (inbound/outbound): {point.spec} sees packets in both "
                        "directions and the skb does not say which (locally made ones say PACKET_HOST); "
                        "filter on direction at a transmit or a receive point")
    off = offsets(point.btf if point.btf.base is None else point.btf.base)
    items = [ldx(DW, R1, FP, skb_slot)]

    def read(size: int, off_: int) -> list:
        return _read(point.typed, size, dst, R1, off_, skb_slot, tmp_slot)
    if field in SKB:
        member, size, swap = SKB[field]
        return items + read(size, off.skb[member]) + ([be(dst, 16)] if swap else [])
    if field in DEV:
        member, size = DEV[field]
        return items + _read(point.typed, DW, R1, R1, off.skb["dev"], skb_slot, tmp_slot) + [
            jmp(JEQ, R1, 0, reject)] + read(size, off.dev[member])
    if field == 4:
        byte, shift, mask = off.pkt_type
        return items + read(B, byte) + ([rshi(dst, shift)] if shift else []) + [andi(dst, mask)]
    if field == 48:
        if off.vlan_all is not None:
            return items + read(W, off.vlan_all) + [alu64(NEG, dst, 0), rshi(dst, 63)]   # != 0, branch-free
        if off.vlan_present is not None:
            byte, bit = off.vlan_present
            return items + read(B, byte) + ([rshi(dst, bit)] if bit else []) + [andi(dst, 1)]
        raise CBPFError(f"Linux ancillary field {name}: this kernel's sk_buff has neither vlan_all nor vlan_present")
    raise CBPFError(f"Linux ancillary field {name}: not served")   # pragma: no cover - ANCILLARY is covered
