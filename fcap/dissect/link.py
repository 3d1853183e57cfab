"""Link layers (Ethernet with VLAN tags and 802.2/SNAP, Linux cooked v1/v2, BSD loopback, raw IP) and ARP."""

from __future__ import annotations

import socket

from fcap import linktypes
from fcap.dissect.ip import ip4, ip6
from fcap.dissect.reader import Packet, Truncated

_ETHERTYPES = {0x0800: "IPv4", 0x0806: "ARP", 0x8035: "Reverse ARP", 0x86DD: "IPv6", 0x8100: "802.1Q",
               0x88A8: "802.1Q-QinQ", 0x8847: "MPLS unicast", 0x8848: "MPLS multicast", 0x88CC: "LLDP",
               0x888E: "EAPOL", 0x9000: "Loopback", 0x88F7: "PTP", 0x9100: "802.1Q-9100", 0x9200: "802.1Q-9200"}
_VLAN_TYPES = (0x8100, 0x9100, 0x9200, 0x88A8)
_BSD_AF = {2: "IPv4", 7: "ISO", 16: "Appletalk", 23: "IPX", 24: "IPv6", 28: "IPv6", 30: "IPv6"}
_ARP_OPS = {1: "Request", 2: "Reply", 3: "Reverse Request", 4: "Reverse Reply", 8: "Inverse Request",
            9: "Inverse Reply", 10: "NACK Reply"}
_ARP_HRD = {1: "Ethernet", 6: "TokenRing", 15: "FrameRelay", 24: "IEEE1394", 32: "Infiniband"}
_SLL_PKTTYPE = {0: "In", 1: "B", 2: "M", 3: "P", 4: "Out"}


def dissect_link(p: Packet, linktype: int, length: int) -> None:
    """The packet from its link-layer header on; length is its length on the wire."""
    if linktype == 1:
        _ether(p, 0, length)
    elif linktype in (101, 228, 229):  # tcpdump picks IPv4 or IPv6 by the version nibble for all three
        p.proto = "ipn"
        version = p.u8(0) >> 4 if length >= 1 else None
        if version in (4, 6):
            (ip4 if version == 4 else ip6)(p, 0, length)
        else:
            p.add(f"truncated-ip {length}" if version is None else f"unknown ip {version}")
    elif linktype == 113:
        p.proto = "sll"
        p.need(0, 16)
        _cooked(p, p.u16(14), 16, length,
                lambda: f"{_SLL_PKTTYPE.get(p.u16(0), '?'):>3} " + (p.mac(6) + " " if p.u16(4) == 6 else ""))
    elif linktype == 276:
        _sll2(p, length)
    elif linktype in (0, 108):
        _null(p, linktype, length)
    else:
        name = linktypes.name_of(linktype)
        p.add(f"unknown linktype {linktype}, length {length}" if name.startswith("LINKTYPE_")
              else f"linktype {name} ({linktype}), length {length}")


def _sll2(p: Packet, length: int) -> None:
    p.proto = "sll2"
    p.need(0, 20)
    try:
        ifname = socket.if_indextoname(p.u32(4))
    except (OSError, OverflowError):
        ifname = "?"
    p.add(f"{ifname:<5} {_SLL_PKTTYPE.get(p.u8(10), '?'):<3} ")
    _cooked(p, p.u16(0), 20, length, lambda: f"ifindex {p.u32(4)} " + (p.mac(12) + " " if p.u8(11) == 6 else ""))


def _null(p: Packet, linktype: int, length: int) -> None:
    """BSD loopback: a 4-byte address family, host order (NULL) or network order (LOOP)."""
    p.proto = "null"
    p.need(0, 4)
    family = int.from_bytes(p.b[:4], "little" if linktype == 0 else "big")
    if family & 0xFFFF0000:
        family = int.from_bytes(family.to_bytes(4, "little"), "big")
    if family == 2:
        ip4(p, 4, length - 4)
    elif family in (24, 28, 30):
        ip6(p, 4, length - 4)
    else:
        p.add(f"AF {_BSD_AF.get(family, 'Unknown')} ({family}), length {length}: ")


def _ether(p: Packet, off: int, length: int) -> None:
    caplen = p.end - off
    if length < caplen:
        p.add(f"[length {length} < caplen {caplen}] (invalid)")
        return
    if caplen < 14:
        p.proto = "ether"
        raise Truncated
    dst, src, orig = p.mac(off), p.mac(off + 6), length
    etype, off, length = p.u16(off + 12), off + 14, length - 14
    while etype in _VLAN_TYPES:  # VLAN tags: tcpdump shows them only with -e
        if p.end - off < 4 or length < 4:
            p.proto = "vlan"
            raise Truncated
        etype, off, length = p.u16(off + 2), off + 4, length - 4
    if etype <= 1500 or etype == 0x8870:  # 802.3 length or jumbo: an LLC header follows (SNAP only decoded)
        if etype <= 1500:
            length = min(length, etype)
            p.end = min(p.end, off + length)
        _llc(p, off, length, f"{src} > {dst}, 802.3, length {length}: ")
    elif not _ethertype(p, etype, off, length):
        p.add(f"{src} > {dst}, ethertype {_ETHERTYPES.get(etype, 'Unknown')} (0x{etype:04x}), length {orig}: ")


def _llc(p: Packet, off: int, length: int, header: str) -> None:
    """An 802.2 header: SNAP with an Ethernet type is followed; anything else is only named."""
    p.proto = "llc"
    dsap, ssap, ctrl = p.u8(off), p.u8(off + 1), p.u8(off + 2)
    if dsap == ssap == 0xAA and ctrl == 3:
        p.proto = "snap"
        p.need(off + 3, 5)
        if p.u16(off + 3) == 0 and p.b[off + 5] == 0 and _ethertype(p, p.u16(off + 6), off + 8, length - 8):
            return
    p.add(f"{header}LLC, dsap 0x{dsap:02x}, ssap 0x{ssap:02x}")


def _ethertype(p: Packet, etype: int, off: int, length: int) -> bool:
    if etype == 0x0800:
        ip4(p, off, length)
    elif etype == 0x86DD:
        ip6(p, off, length)
    elif etype in (0x0806, 0x8035):
        _arp(p, off, length)
    else:
        return False
    return True


def _cooked(p: Packet, etype: int, hdr_len: int, length: int, header) -> None:
    """What follows a Linux cooked header (v1 or v2) of hdr_len bytes; length counts the header."""
    off, length = hdr_len, length - hdr_len
    while etype == 0x8100:
        if p.end - off < 4:
            p.proto = "vlan"
            raise Truncated
        etype = p.u16(off + 2)
        etype = 4 if etype <= 1500 else etype
        p.add(f"ethertype {_ETHERTYPES.get(etype, 'Unknown')}, ")
        off, length = off + 4, length - 4
    if etype == 4:
        _llc(p, off, length, f"802.2, length {length}: ")
    elif etype == 1:  # IPX: not decoded here
        p.add(f"802.3, length {length}")
    elif etype > 1500 and not _ethertype(p, etype, off, length):
        p.add(header() + f"ethertype {_ETHERTYPES.get(etype, 'Unknown')} (0x{etype:04x}), length {length + hdr_len}: ")


def _arp(p: Packet, off: int, length: int) -> None:
    p.proto = "arp"
    p.need(off, 8)
    hrd, pro, hln, pln, op = p.u16(off), p.u16(off + 2), p.b[off + 4], p.b[off + 5], p.u16(off + 6)
    if hrd == 19:  # ATM ARP: not decoded here
        raise Truncated
    sha, spa = off + 8, off + 8 + hln
    tha, tpa = spa + pln, spa + pln + hln
    p.need(tpa, pln)
    p.add("ARP, ")
    if pro not in (0x0800, 0x1000) or pln != 4 or hln == 0:
        p.add(f"{_ARP_HRD.get(hrd, f'Unknown Hardware ({hrd})')} (len {hln}), "
              f"{_ETHERTYPES.get(pro, f'Unknown Protocol (0x{pro:04x})')} (len {pln}), length {length}")
        return
    p.add(_ARP_OPS.get(op, f"Unknown ({op})") + " ")
    if op not in _ARP_OPS or op == 10:
        return
    p.add({1: f"who-has {p.ip4(tpa)}" + (f" ({p.mac(tha, hln)})" if any(p.b[tha:tha + hln]) else "")
              + f" tell {p.ip4(spa)}",
           2: f"{p.ip4(spa)} is-at {p.mac(sha, hln)}", 3: f"who-is {p.mac(tha, hln)} tell {p.mac(sha, hln)}",
           4: f"{p.mac(tha, hln)} at {p.ip4(tpa)}", 8: f"who-is {p.mac(tha, hln)} tell {p.mac(sha, hln)}",
           9: f"{p.mac(sha, hln)} at {p.ip4(spa)}"}[op] + f", length {length}")
