"""fcap.dissect's IPv6 printers: the IPv6 header and its extension headers, ICMPv6."""

from __future__ import annotations

from fcap.dissect import _Packet, _Trunc, _ip_demux

_ICMP6 = {1: "destination unreachable", 2: "packet too big", 3: "time exceeded in-transit", 4: "parameter problem",
          128: "echo request", 129: "echo reply", 130: "multicast listener query", 131: "multicast listener report",
          132: "multicast listener done", 133: "router solicitation", 134: "router advertisement",
          135: "neighbor solicitation", 136: "neighbor advertisement", 137: "redirect", 138: "router renumbering",
          139: "node information query", 140: "node information reply", 141: "inverse neighbor solicitation",
          142: "inverse neighbor advertisement", 143: "multicast listener report v2", 144: "ha discovery request",
          145: "ha discovery reply", 146: "mobile router solicitation", 147: "mobile router advertisement",
          155: "RPL", 200: "mtrace response", 201: "mtrace message"}
_UNREACH6 = {0: "unreachable route", 1: " unreachable prohibited", 2: "beyond scope", 3: "unreachable address",
             4: "unreachable port"}
_PARAMPROB6 = {0: "erroneous", 1: "next header", 2: "option", 3: "incomplete header chain"}


# ------------------------------------------------------------------------------------------ IPv6

def ip6(p: _Packet, off: int, length: int) -> None:
    p.proto = "ip6"
    p.need(off, 40)
    if length < 40:
        p.add(f"truncated-ip6 {length}")
        return
    p.add("IP6 ")
    if p.b[off] >> 4 != 6:
        p.add(f"version error: {p.b[off] >> 4} != 6")
        return
    plen = p.u16(off + 4)
    left = plen + 40 if plen else length + 40
    if plen and length < left:
        p.add(f"truncated-ip6 - {left - length} bytes missing!")
    nh, prev = p.u8(off + 6), 255
    p.end = min(p.end, off + left)
    cp, advance, total = off, 40, 0
    found_ext = found_jumbo = found_hbh = fragmented = False
    while cp < p.end and advance > 0:  # extension headers, as tcpdump's ip6_print walks them
        if left < advance:
            raise _Trunc
        cp, left, total = cp + advance, left - advance, total + advance
        if cp == off + 40 and nh not in (6, 17):
            p.add(f"{p.ip6(off + 8)} > {p.ip6(off + 24)}: ")
        if nh == 0:
            if found_hbh or prev != 255:
                p.add("[The Hop-by-Hop Options header " + (
                    "was already found]" if found_hbh else "don't follow the IPv6 header]") + " (invalid)")
                return
            p.proto = "hbhopt"
            advance = (p.u8(cp + 1) + 1) << 3
            jumbo = False
            if cp + advance <= p.end:
                p.add("HBH ")
                jumbo = _jumbo(p, cp + 2, advance - 2, plen)
            if jumbo is False:
                p.add(" [|hbhopt]")
            elif jumbo is not None:
                found_jumbo, plen = True, jumbo
            if plen == 0 and not found_jumbo:
                p.add("[No valid Jumbo Payload Hop-by-Hop option found] (invalid)")
            if jumbo is False or (plen == 0 and not found_jumbo):
                return
            found_ext = found_hbh = True
        elif nh == 60:
            p.proto = "dstopt"
            advance = (p.u8(cp + 1) + 1) << 3
            p.need(cp, advance)
            p.add("DSTOPT ")
            found_ext = True
        elif nh == 44:
            p.proto = "frag6"
            offset = p.u16(cp + 2) & 0xFFF8
            p.add(f"frag ({offset}|{(40 + p.u16(off + 4) - (cp - off) - 8) % 2**64})")
            if offset:
                return
            p.add(" ")
            advance, found_ext, fragmented = 8, True, True
            if p.end <= cp + advance:
                return
        elif nh == 43:
            p.u8(cp)
            p.proto = "rt6"
            advance = _rt6(p, cp)
            if advance < 0:
                return
            found_ext = True
        else:
            if found_jumbo:
                left = plen + 40
                if left < total:
                    raise _Trunc
                if length < left:
                    p.add(f"truncated-ip6 - {left - length} bytes missing!")
                p.end, left = min(len(p.b), off + left), left - total
            elif plen == 0:
                if found_ext:
                    raise _Trunc
                p.end, left = min(len(p.b), off + 40), 40 - total
            _ip_demux(p, cp, left, 6, fragmented, nh, off)
            return
        nh = prev = p.u8(cp)
        p.proto = "ip6"


def _jumbo(p: _Packet, off: int, length: int, plen: int):
    """Hop-by-hop options: a valid jumbo payload length, None if there is none, False if the options are damaged
    (tcpdump also names the damage, "(jumbo: trunc)" and the like; that is not copied here)."""
    i, jumbo = 0, None
    while i < length:
        kind = p.b[off + i]
        size = 1 if kind == 0 else p.b[off + i + 1] + 2 if i + 1 < length else length + 1
        if i + size > length or (kind == 5 and size != 4) or (kind == 0xC2 and size != 6):
            return False
        if kind == 0xC2 and jumbo is None and plen == 0 and p.u32(off + i + 2) >= 65536:
            jumbo = p.u32(off + i + 2)
        i += size
    return jumbo


def _rt6(p: _Packet, cp: int) -> int:
    """A routing header (types 0, 2 and 4 as tcpdump shows them); its length, or -1 to stop."""
    p.add("RT6")
    rlen = p.u8(cp + 1)
    p.add(f" (len={rlen}")
    rtype = p.u8(cp + 2)
    p.add(f", type={rtype}" + (" [Deprecated]" if rtype == 0 else "") + f", segleft={p.u8(cp + 3)}")
    if rtype in (0, 2) and p.u32(cp + 4):
        p.add(f", rsv=0x{p.u32(cp + 4):x}")
    elif rtype == 4:
        p.add(f", last-entry={p.u8(cp + 4)}" + (f", flags=0x{p.b[cp + 5]:x}" if p.u8(cp + 5) else "")
              + f", tag={p.u16(cp + 6):x}")
    if rtype not in (0, 2, 4) or rlen % 2:
        p.add(" (unknown type) (invalid)" if rtype not in (0, 2, 4) else f" (invalid length {rlen}) (invalid)")
        return -1
    p.add("".join(f", [{i}]{p.ip6(cp + 8 + 16 * i)}" for i in range(rlen // 2)) + ") ")
    return (rlen + 1) << 3


# ------------------------------------------------------------------------------------------ ICMPv6

def icmp6(p: _Packet, off: int, length: int) -> None:
    p.proto = "icmp6"
    if length == 0:
        p.add("ICMP6, length 0 (invalid)")
        return
    kind = p.u8(off)
    p.add("ICMP6, " + _ICMP6.get(kind, f"unknown icmp6 type ({kind})"))
    code, inner = p.u8(off + 1), off + 8
    if kind == 1:
        p.add(", " + _UNREACH6.get(code, f"unknown unreach code ({code})"))
        if code in (0, 1, 3):
            p.add(f" {p.ip6(inner + 24)}")
        elif code == 2:
            p.add(f" {p.ip6(inner + 24)}, source address {p.ip6(inner + 8)}")
        elif code == 4:
            proto, dport = _upper_layer(p, inner)
            p.add(f", {p.ip6(inner + 24)} " + (f"{'tcp' if proto == 6 else 'udp'} port {dport}" if proto in (6, 17)
                                               else f"protocol {proto} port {dport} unreachable"))
        else:
            return
    elif kind == 2:
        p.add(f", mtu {p.u32(off + 4)}")
    elif kind == 3:
        p.add(f" for {p.ip6(inner + 24)}" if code == 0 else " (reassembly)" if code == 1
              else f", unknown code ({code})")
    elif kind == 4:
        p.need(inner + 24, 16)
        p.add(f", {_PARAMPROB6[code]} - octet {p.u32(off + 4)}" if code in _PARAMPROB6 else f", code-#{code}")
    elif kind in (128, 129):
        p.add(f", id {p.u16(off + 4)}, seq {p.u16(off + 6)}")
    elif kind == 130 and length != 24:  # MLDv2 query
        nsrcs = p.u16(off + 26) if length >= 28 else 0
        p.add(f" unknown-version (len {length}) " if length < 28 else f" v2 [gaddr {p.ip6(off + 8)}" + (
            "" if not nsrcs else " [invalid number of sources]" if length < 28 + 16 * nsrcs
            else f", {nsrcs} source(s)") + "]")
    elif kind in (130, 131, 132) and off + 24 <= p.end:  # MLDv1 (tcpdump puts no space before it)
        p.add(f"max resp delay: {p.u16(off + 4)} addr: {p.ip6(off + 8)}")
    elif kind in (135, 136):
        p.add((", who has " if kind == 135 else ", tgt is ") + p.ip6(off + 8))
    elif kind == 137:
        p.add(f", {p.ip6(off + 24)} to {p.ip6(off + 8)}")
    elif kind == 143:
        p.add(f", {p.u16(off + 6)} group record(s)" if length >= 8 else f" [invalid len {length}]")
    elif kind in (144, 146):
        p.add(f", id 0x{p.u16(off + 4):04x}")
    p.add(f", length {length}")


def _upper_layer(p: _Packet, ip6: int) -> tuple[int, int]:
    """The protocol and destination port of a quoted IPv6 packet, past its extension headers."""
    nh, cp, hlen = p.u8(ip6 + 6), ip6, 40
    while cp + hlen + 4 <= p.end:
        cp += hlen
        if nh in (6, 17):
            return nh, p.u16(cp + 2)
        if nh not in (0, 43, 60, 51, 44) or (nh == 44 and p.u16(cp + 2) & 0xFFF8):
            break
        nh, hlen = p.b[cp], 8 if nh == 44 else ((p.b[cp + 1] + 2) << 2) if nh == 51 else ((p.b[cp + 1] + 1) << 3)
    raise _Trunc
