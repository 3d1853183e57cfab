"""What the skb holds beside its bytes, as packet sockets give it: Linux's ancillary fields (cBPF's `ld [SKF_AD_OFF
+ n]`: inbound/outbound, ifindex, mark, ...) for a translated filter, and an offloaded VLAN tag put back into the
bytes of EN10MB captures."""

from __future__ import annotations

from functools import lru_cache

from bpf import asm
from bpf.asm import (ADD, JEQ, JGT, JNE, NEG, R0, R1, R2, R3, R6, R7, R8, R9, B, DW, FP, H, W, addi, alu64, andi, be,
                     call, jmp, label, ldx, mov, mov32, movi, rshi, st, stx)
from bpf.btf import BTF
from bpf.cbpf import ANCILLARY, CBPFError
from bpf.cbpf_plan import ancillary_field
from bpf.uapi import Helper

from fcap.kernel.parts import HEADERS, Part, has_skb
from fcap.kernel.layout import FLAG_MAC_SYNTH, META, PKT, PREFIX_MAX, START_MAC, STACK
from fcap.files.linktypes import PACKET_OUTGOING

NBYTES = {B: 1, H: 2, W: 4, DW: 8}
# field → (sk_buff member, size, big-endian): the plain loads
SKB = {0: ("protocol", H, True), 12: ("mark", W, False), 16: ("queue_mapping", H, False), 32: ("hash", W, False),
       44: ("vlan_tci", H, False), 60: ("vlan_proto", H, True)}
DIRECTION = 4   # pkt_type: the point's direction decides it at a transmit point and where the skb cannot say
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


def load(point, field: int, dst: int, reject: str, skb_slot: int, tmp_slot: int, snap=None) -> list:
    """Code loading ancillary field `field` into dst (a u32) for a filter at `point`; the skb pointer is in the
    stack at skb_slot; `snap`, an untyped program's copy of the skb's members (fcap.kernel.snapshot), META's address
    at STACK.scratch. May clobber R0-R5. Raises CBPFError where the field means nothing at this point."""
    name = ANCILLARY[field]
    if field in REFUSED:
        raise CBPFError(f"Linux ancillary field {name}: {REFUSED[field]}")
    without_skb = _without_skb(point, field, dst, name)
    if without_skb is not None:
        return without_skb
    off = offsets(point.btf.root)

    def read(size: int, off_: int, to: int = dst) -> list:   # the skb's member at off_
        if snap is not None and snap.covers(size, off_):
            return [ldx(DW, R1, FP, STACK.scratch), snap.load(size, to, R1, off_)]
        return [ldx(DW, R1, FP, skb_slot)] + _read(point.typed, size, to, R1, off_, skb_slot, tmp_slot)
    if field in SKB:
        member, size, swap = SKB[field]
        return read(size, off.skb[member]) + ([be(dst, 16)] if swap else [])
    if field in DEV:
        member, size = DEV[field]
        return read(DW, off.skb["dev"], R1) + [jmp(JEQ, R1, 0, reject)] + _read(
            point.typed, size, dst, R1, off.dev[member], skb_slot, tmp_slot)
    if field == DIRECTION:
        byte, shift, mask = off.pkt_type
        return read(B, byte) + ([rshi(dst, shift)] if shift else []) + [andi(dst, mask)]
    if field == 48:
        if off.vlan_all is not None:
            return read(W, off.vlan_all) + [alu64(NEG, dst, 0), rshi(dst, 63)]   # != 0, branch-free
        if off.vlan_present is not None:
            byte, bit = off.vlan_present
            return read(B, byte) + ([rshi(dst, bit)] if bit else []) + [andi(dst, 1)]
        raise CBPFError(f"Linux ancillary field {name}: this kernel's sk_buff has neither vlan_all nor vlan_present")
    raise CBPFError(f"Linux ancillary field {name}: not served")   # pragma: no cover - ANCILLARY is covered


def reads_direction(cbpf: list | None) -> bool:
    """Whether a cBPF filter loads the packet's type (`inbound`, `outbound`), which the code for a point builds from
    the point's direction."""
    return any(ancillary_field(code, k) == DIRECTION for code, _jt, _jf, k in cbpf or ())


def _without_skb(point, field: int, dst: int, name: str) -> list | None:
    """Code for the fields that do not read the skb (the CPU, a random number, the direction the point implies);
    None for the others."""
    if field == 36:
        return [call(Helper.get_smp_processor_id)] + ([mov32(dst, R0)] if dst != R0 else [])
    if field == 56:
        return [call(Helper.get_prandom_u32)] + ([mov32(dst, R0)] if dst != R0 else [])
    if field == DIRECTION and point.direction == "out":
        return [movi(dst, PACKET_OUTGOING)]   # what packet sockets see on transmit, whatever the skb says
    if field == DIRECTION and point.direction is None:
        raise CBPFError(f"Linux ancillary field {name} (inbound/outbound): {point.spec} sees packets in both "
                        "directions and the skb does not say which (locally made ones say PACKET_HOST); "
                        "filter on direction at a transmit or a receive point")
    return None


def vlan_tag(b) -> None:
    """An 802.1Q tag the kernel holds in the skb (vlan_tci: offloaded) rather than in the bytes goes back in
    after the MAC addresses, as libpcap puts it back from AF_PACKET's auxdata: files and filters see what
    tcpdump shows. The MAC header is then either in the header bytes (receive: 4 bytes more of them) or the
    skb's first bytes (transmit: their first 12 become header bytes, and the skb's bytes start 12 later).
    Leaves R8 = hdr_total."""
    off, f = offsets(b.point.btf.root), b.offsets
    v = b.fresh_names("vlan", "tx", "put", "done")
    if off.vlan_all is None and off.vlan_present is None:
        return
    b.emit(META.load(R0, R7, "flags"), jmp(asm.JSET, R0, FLAG_MAC_SYNTH, v.done))
    if off.vlan_all is not None:   # 6.2+: vlan_all != 0; before: a one-bit vlan_present
        b.read(W, R8, R6, off.vlan_all)
    else:
        b.read(B, R8, R6, off.vlan_present[0])
        b.emit(rshi(R8, off.vlan_present[1]), andi(R8, 1))
    b.read(H, R9, R6, f.mac)
    b.emit(jmp(JEQ, R8, 0, v.done), META.load(R0, R7, "skip"), jmp(JNE, R0, 0, v.done),
           META.load(R8, R7, "hdr"), jmp(JEQ, R8, 0, v.tx), jmp(asm.JLT, R8, 14, v.done),
           jmp(JGT, R8, PREFIX_MAX, v.done),
           # receive: [mac + 12, data) again, 4 bytes further on
           mov(R2, R8), addi(R2, -12), mov(R1, R7), addi(R1, PKT + 16), ldx(DW, R3, FP, STACK.head),
           alu64(ADD, R3, R9, reg=True), addi(R3, 12), call(Helper.probe_read_kernel),
           jmp(JNE, R0, 0, v.done), addi(R8, 4), META.store(R7, "hdr", R8), asm.ja(v.put),
           # transmit: the MAC header starts the skb's data
           label(v.tx), ldx(DW, R3, FP, STACK.dataoff), jmp(JNE, R3, R9, v.done, reg=True),
           mov(R1, R7), addi(R1, PKT), movi(R2, 12), ldx(DW, R0, FP, STACK.head), alu64(ADD, R3, R0, reg=True),
           call(Helper.probe_read_kernel), jmp(JNE, R0, 0, v.done),
           META.store_imm(R7, "skip", 12), META.store_imm(R7, "hdr", 16), label(v.put))
    b.read(H, R8, R6, off.skb["vlan_proto"])   # (network order, as it is)
    b.emit(stx(H, R7, PKT + 12, R8))
    b.read(H, R8, R6, off.skb["vlan_tci"])
    b.emit(be(R8, 16), stx(H, R7, PKT + 14, R8), label(v.done), META.load(R8, R7, "hdr"))


VLAN_TAG = Part("vlan tag", on=lambda point, options, maps: options.start == START_MAC and has_skb(point),
                   stages={HEADERS: vlan_tag}, fields=("hdr", "skip"))
