"""Link layers (Ethernet with VLAN tags and 802.2/SNAP, Linux cooked v1/v2, BSD loopback, raw IP) and ARP."""

from __future__ import annotations

import socket
from collections.abc import Callable

from fcap.files import linktypes
from fcap.text.dissect.ip import ip4, ip6
from fcap.text.dissect.reader import PrintState, Truncated

_ETHERTYPES = {0x0800: "IPv4", 0x0806: "ARP", 0x8035: "Reverse ARP", 0x86DD: "IPv6", 0x8100: "802.1Q",
               0x88A8: "802.1Q-QinQ", 0x8847: "MPLS unicast", 0x8848: "MPLS multicast", 0x88CC: "LLDP",
               0x888E: "EAPOL", 0x9000: "Loopback", 0x88F7: "PTP", 0x9100: "802.1Q-9100", 0x9200: "802.1Q-9200"}
_BSD_AF = {2: "IPv4", 7: "ISO", 16: "Appletalk", 23: "IPX", 24: "IPv6", 28: "IPv6", 30: "IPv6"}
BSD_AF_INET, BSD_AF_INET6 = 2, (24, 28, 30)   # (AF_INET6: NetBSD and OpenBSD, FreeBSD, macOS)
_ARP_OPS = {1: "Request", 2: "Reply", 3: "Reverse Request", 4: "Reverse Reply", 8: "Inverse Request",
            9: "Inverse Reply", 10: "NACK Reply"}
_ARP_HRD = {1: "Ethernet", 6: "TokenRing", 15: "FrameRelay", 24: "IEEE1394", 32: "Infiniband"}
_SLL_PKTTYPE = {0: "In", 1: "B", 2: "M", 3: "P", 4: "Out"}


def dissect_link(p: PrintState, linktype: int, length: int) -> None:
    """The packet from its link-layer header on; length is its length on the wire. Sets p.hdr as it goes."""
    framing = linktypes.framing(linktype)
    if framing == "ethernet":
        _ether(p, 0, length)
    elif framing == "raw":
        _raw(p, length)
    elif framing == "sll":
        _sll(p, length)
    elif framing == "sll2":
        _sll2(p, length)
    elif framing == "null":
        _null(p, linktype, length)
    else:
        name = linktypes.name_of(linktype)
        p.add(f"unknown linktype {linktype}, length {length}" if name.startswith("LINKTYPE_")
              else f"linktype {name} ({linktype}), length {length}")


def _raw(p: PrintState, length: int) -> None:
    """Raw IP: tcpdump picks IPv4 or IPv6 by the version nibble, whichever raw link type says it."""
    p.proto = "raw"
    if p.eflag:
        p.add("ip: ")
    p.proto = "ipn"
    version = p.u8(0) >> 4 if length >= 1 else None
    if version in (4, 6):
        (ip4 if version == 4 else ip6)(p, 0, length)
    else:
        p.add(f"truncated-ip {length}" if version is None else f"unknown ip {version}")


def bsd_family(head: bytes, linktype: int) -> int:
    """The address family a BSD loopback header's 4 bytes hold: host order (NULL; read little-endian, or swapped
    where that gives high bits) or network order (LOOP)."""
    family = int.from_bytes(head[:4], "little" if linktype == linktypes.NULL.number else "big")
    if family & 0xFFFF0000:
        family = int.from_bytes(family.to_bytes(4, "little"), "big")
    return family


def _ethertype_name(etype: int) -> str:
    return f"ethertype {_ETHERTYPES.get(etype, 'Unknown')} (0x{etype:04x})"


def _cooked_type(etype: int) -> str:
    """What a cooked header's protocol says, as tcpdump's sll_print puts it."""
    if etype > 1500:
        return _ethertype_name(etype)
    return {1: "802.3", 4: "802.2"}.get(etype, f"ethertype Unknown (0x{etype:04x})")


def _vlan_tci(tci: int) -> str:
    return f"vlan {tci & 0xFFF}, p {tci >> 13}" + (", DEI" if tci & 0x1000 else "")


def _sll(p: PrintState, length: int) -> None:
    p.proto = "sll"
    p.need(0, 16)
    _cooked_layer(p, p.u16(14), p.u16(0), 6, p.u16(4))

    def header(total: int) -> str:
        return f"{_SLL_PKTTYPE.get(p.u16(0), '?'):>3} " + (p.mac(6) + " " if p.u16(4) == 6 else "") + \
            f"{_cooked_type(p.u16(14))}, length {total}: "
    if p.eflag:
        p.add(header(length))
    _cooked(p, p.u16(14), 16, length, header)


def _sll2(p: PrintState, length: int) -> None:
    p.proto = "sll2"
    p.need(0, 20)
    _cooked_layer(p, p.u16(0), p.u8(10), 12, p.u8(11), ifindex=int.from_bytes(p.b[4:8], "big", signed=True))
    try:
        ifname = socket.if_indextoname(p.u32(4))
    except (OSError, OverflowError):
        ifname = "?"
    p.add(f"{ifname:<5} {_SLL_PKTTYPE.get(p.u8(10), '?'):<3} ")

    def header(total: int) -> str:
        return f"ifindex {p.u32(4)} " + (p.mac(12) + " " if p.u8(11) == 6 else "") + \
            f"{_cooked_type(p.u16(0))}, length {total}: "
    if p.eflag:
        p.add(header(length))
    _cooked(p, p.u16(0), 20, length, header)


def _cooked_layer(p: PrintState, etype: int, pkttype: int, addr: int, alen: int, **more) -> None:
    """A cooked header's fields: its protocol, packet type, more (sll2's ifindex), the source when a MAC."""
    link = p.layer("link", ethertype=etype, pkttype=pkttype, **more)
    if alen == 6:
        link["src"] = p.mac(addr)


def _null(p: PrintState, linktype: int, length: int) -> None:
    """BSD loopback: a 4-byte address family, host order (NULL) or network order (LOOP)."""
    p.proto = "null"
    p.need(0, 4)
    p.hdr = 4
    family = bsd_family(p.b[:4], linktype)
    p.layer("link", family=family)
    header = f"AF {_BSD_AF.get(family, 'Unknown')} ({family}), length {length}: "
    if p.eflag:
        p.add(header)
    if family == BSD_AF_INET:
        ip4(p, 4, length - 4)
    elif family in BSD_AF_INET6:
        ip6(p, 4, length - 4)
    else:
        if not p.eflag:
            p.add(header)
        p.default_print(4, p.end - 4, unless_suppressed=True)


def _ether(p: PrintState, off: int, length: int) -> None:
    caplen = p.end - off
    if length < caplen:
        p.add(f"[length {length} < caplen {caplen}] (invalid)")
        p.hdr = length
        return
    if caplen < 14:
        p.proto, p.hdr = "ether", caplen
        raise Truncated(soft=True)
    dst, src, orig = p.mac(off), p.mac(off + 6), length
    if p.eflag:
        p.add(f"{src} > {dst}, ")
    p.hdr = 14
    link = p.layer("link", dst=dst, src=src)
    etype, off, length, told_length = _vlan_tags(p, p.u16(off + 12), off + 14, length - 14, orig, link)
    link["ethertype"] = etype
    if etype <= 1500 or etype == 0x8870:  # 802.3 length or jumbo: an LLC header follows (SNAP only decoded)
        if etype <= 1500:
            length = min(length, etype)
            p.end = min(p.end, off + length)
            if p.eflag:
                p.add("802.3" + ("" if told_length else f", length {length}: "))
        if not _llc(p, off, length, f"{src} > {dst}, 802.3, length {length}: ", True):
            p.default_print(off, p.end - off, unless_suppressed=True)
        return
    if p.eflag:
        p.add(_ethertype_name(etype) + (", " if told_length else f", length {orig}: "))
    if not _ethertype(p, etype, off, length):
        if not p.eflag:
            p.add(f"{src} > {dst}, {_ethertype_name(etype)}, length {orig}: ")
        p.default_print(off, p.end - off, unless_suppressed=True)


def _vlan_tags(p: PrintState, etype: int, off: int, length: int, orig: int, link: dict) -> tuple[int, int, int, bool]:
    """Past an Ethernet header's VLAN tags (shown only with -e; their ids into link's "vlan"): the type, offset and
    length after them, and whether -e said ", length N: " (tcpdump says it once, after the first type)."""
    told_length = False
    while etype in linktypes.VLAN_TPIDS:
        if p.end - off < 4 or length < 4:
            p.proto, p.hdr = "vlan", p.hdr + max(0, min(p.end - off, length))
            raise Truncated(soft=True)
        if p.eflag:
            p.add(_ethertype_name(etype) + (", " if told_length else f", length {orig}: ") + _vlan_tci(p.u16(off)) +
                  ", ")
            told_length = True
        link.setdefault("vlan", []).append(p.u16(off) & 0xFFF)
        etype, off, length, p.hdr = p.u16(off + 2), off + 4, length - 4, p.hdr + 4
    return etype, off, length, told_length


_LLC_SAPS = {0x00: "Null", 0xFF: "Global", 0x02: "802.1B I", 0x03: "802.1B G", 0x04: "SNA", 0x06: "IP",
             0x0E: "ProWay NM", 0x42: "STP", 0x4E: "RS511", 0x7E: "ISO8208", 0x8E: "ProWay", 0xAA: "SNAP",
             0xE0: "IPX", 0xF0: "NetBeui", 0xFE: "OSI"}


def _llc(p: PrintState, off: int, length: int, header: str, count_undecoded: bool) -> bool:
    """An 802.2 header: SNAP with an Ethernet type is followed; anything else is only named. Adds to p.hdr the
    LLC (and SNAP) header length as tcpdump counts it: before what follows is printed; where that is not decoded,
    only when count_undecoded (tcpdump's Ethernet printer counts it then, its cooked printers do not). Whether
    what follows was decoded."""
    p.proto = "llc"
    caplen = p.end - off
    dsap, ssap, ctrl = (p.u8(off), p.u8(off + 1), p.u8(off + 2)) if caplen >= 3 else (0, 0, 0)
    hlen = 3 if ctrl & 3 == 3 else 4
    if caplen < hlen or length < hlen:
        p.hdr += max(0, min(caplen, length))   # (tcpdump's llc_print returns what there is: all of it)
        p.add(f" [|{p.proto}]")
        p.default_print(off, caplen)
        raise Truncated(soft=True, said=True)
    if hlen == 4:
        ctrl = p.u8(off + 2) | p.u8(off + 3) << 8
    if p.eflag and not dsap == ssap == 0xFF:
        p.add(f"LLC, dsap {_LLC_SAPS.get(dsap & 0xFE, 'Unknown')} (0x{dsap & 0xFE:02x}) "
              f"{'Group' if dsap & 1 else 'Individual'}, ssap {_LLC_SAPS.get(ssap & 0xFE, 'Unknown')} "
              f"(0x{ssap & 0xFE:02x}) {'Response' if ssap & 1 else 'Command'}, ctrl 0x{ctrl:0{2 * (hlen - 2)}x}: ")
    if dsap & 0xFE == ssap & 0xFE == 0xAA and ctrl == 3:
        p.proto = "snap"
        if caplen < 8 or length < 8:
            p.hdr += 8
            raise Truncated(soft=True)
        oui, et = int.from_bytes(p.b[off + 3:off + 6], "big"), p.u16(off + 6)
        if p.eflag:
            p.add(f"oui {'Ethernet' if oui == 0 else 'Unknown'} (0x{oui:06x}), "
                  f"{'ethertype' if oui == 0 else 'pid'} {_ETHERTYPES.get(et, 'Unknown') if oui == 0 else 'Unknown'}"
                  f" (0x{et:04x}), length {length - 8}: ")
        if oui == 0 and et in _DECODED:
            p.hdr += 8
            return _ethertype(p, et, off + 8, length - 8)
        hlen = 8
    if not p.eflag:
        p.add(f"{header}LLC, dsap 0x{dsap:02x}, ssap 0x{ssap:02x}")
    if count_undecoded:
        p.hdr += hlen
    return False


_DECODED = (0x0800, 0x86DD, 0x0806, 0x8035)   # the Ethernet types _ethertype decodes


def _ethertype(p: PrintState, etype: int, off: int, length: int) -> bool:
    if etype == 0x0800:
        ip4(p, off, length)
    elif etype == 0x86DD:
        ip6(p, off, length)
    elif etype in (0x0806, 0x8035):
        _arp(p, off, length)
    else:
        return False
    return True


def _cooked(p: PrintState, etype: int, hdr_len: int, length: int, header: Callable[[int], str]) -> None:
    """What follows a Linux cooked header (v1 or v2) of hdr_len bytes; length counts the header; header(total)
    is the cooked header's text (tcpdump prints it with -e, or where the type is not decoded)."""
    off, length, p.hdr = hdr_len, length - hdr_len, hdr_len
    while etype == 0x8100:
        if p.end - off < 4:
            p.proto, p.hdr = "vlan", p.end
            raise Truncated(soft=True)
        if p.eflag:
            p.add(_vlan_tci(p.u16(off)) + ", ")
        etype = p.u16(off + 2)
        etype = 4 if etype <= 1500 else etype
        p.add(f"ethertype {_ETHERTYPES.get(etype, 'Unknown')}, ")
        off, length, p.hdr = off + 4, length - 4, p.hdr + 4
    if etype == 4:
        if not _llc(p, off, length, "" if p.eflag else f"802.2, length {length}: ", False):
            p.default_print(off, p.end - off, unless_suppressed=True)
    elif etype == 1:  # IPX: not decoded here
        if not p.eflag:
            p.add(f"802.3, length {length}")
    elif etype <= 1500 or not _ethertype(p, etype, off, length):
        if etype > 1500 and not p.eflag:
            p.add(header(length + hdr_len))
        p.default_print(off, p.end - off, unless_suppressed=True)


def _arp(p: PrintState, off: int, length: int) -> None:
    p.proto = "arp"
    p.need(off, 8)
    hrd, pro, hln, pln, op = p.u16(off), p.u16(off + 2), p.b[off + 4], p.b[off + 5], p.u16(off + 6)
    if hrd == 19:  # ATM ARP: not decoded here
        raise Truncated
    sha, spa = off + 8, off + 8 + hln
    tha, tpa = spa + pln, spa + pln + hln
    p.need(tpa, pln)
    if not p.eflag:
        p.add("ARP, ")
    if pro == 0x0800 and pln == 4:
        p.layer("arp", op=op, src=p.ip4(spa), dst=p.ip4(tpa))
    if pro not in (0x0800, 0x1000) or pln != 4 or hln == 0 or p.verbose:
        p.add(f"{_ARP_HRD.get(hrd, f'Unknown Hardware ({hrd})')} (len {hln}), "
              f"{_ETHERTYPES.get(pro, f'Unknown Protocol (0x{pro:04x})')} (len {pln})")
        if not p.verbose:
            p.add(f", length {length}")
            return
        p.add(", ")
    p.add(_ARP_OPS.get(op, f"Unknown ({op})") + " ")
    if op not in _ARP_OPS or op == 10:
        p.default_print(off, p.end - off)
        return
    def mac(at: int) -> str:
        return p.mac(at, hln) if hln else "<empty>"

    def ip(at: int) -> str:   # (-v gets here with any protocol)
        return "<wrong proto type>" if pro not in (0x0800, 0x1000) else "<wrong len>" if pln != 4 else p.ip4(at)

    p.add({1: f"who-has {ip(tpa)}" + (f" ({mac(tha)})" if any(p.b[tha:tha + hln]) else "")
              + f" tell {ip(spa)}",
           2: f"{ip(spa)} is-at {mac(sha)}", 3: f"who-is {mac(tha)} tell {mac(sha)}",
           4: f"{mac(tha)} at {ip(tpa)}", 8: f"who-is {mac(tha)} tell {mac(sha)}",
           9: f"{mac(sha)} at {ip(spa)}"}[op] + f", length {length}")
