"""ICMP and ICMPv6 messages, as tcpdump -nn prints them (the IP header an error quotes is read here too)."""

from __future__ import annotations

from fcap.text.dissect.reader import PrintState, Truncated

_ICMP = {0: "echo reply", 4: "source quench", 8: "echo request", 9: "router advertisement", 10: "router solicitation",
         13: "time stamp request", 14: "time stamp reply", 15: "information request", 16: "information reply",
         17: "address mask request"}
_UNREACH = {0: "net %s unreachable", 1: "host %s unreachable", 5: "%s unreachable - source route failed",
            6: "net %s unreachable - unknown", 7: "host %s unreachable - unknown",
            8: "%s unreachable - source host isolated", 9: "net %s unreachable - admin prohibited",
            10: "host %s unreachable - admin prohibited", 11: "net %s unreachable - tos prohibited",
            12: "host %s unreachable - tos prohibited", 13: "host %s unreachable - admin prohibited filter",
            14: "host %s unreachable - host precedence violation", 15: "host %s unreachable - precedence cutoff"}
_REDIRECT = {0: "redirect %s to net %s", 1: "redirect %s to host %s", 2: "redirect-tos %s to net %s",
             3: "redirect-tos %s to host %s"}

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
_ICMP6_DECODED = frozenset((1, 2, 3, 4, 155, *range(128, 148)))   # the types tcpdump's icmp6_print has a case for
_IP6_EXT_HEADERS = (0, 43, 60, 51, 44)  # hop-by-hop, routing, destination options, AH, fragment


# ------------------------------------------------------------------------------------------ ICMP

def icmp(p: PrintState, off: int, plen: int) -> None:
    p.proto = "icmp"
    kind, code = p.u8(off), p.u8(off + 1)
    inner = off + 8  # the IP header an error message quotes
    if kind in (0, 8):
        text = f"echo {'request' if kind == 8 else 'reply'}, id {p.u16(off + 4)}, seq {p.u16(off + 6)}"
    elif kind == 3 and code == 3:
        p.need(inner + 9, 1, soft=True)
        proto = p.u8(inner + 9)
        dport = p.u16(inner + (p.u8(inner) & 15) * 4 + 2)
        what = {6: "tcp port", 17: "udp port"}.get(proto, f"protocol {proto} port")
        text = f"{p.ip4(inner + 16)} {what} {dport} unreachable"
    elif kind == 3 and code in (2, 4):
        mtu = p.u16(off + 6)
        text = (f"{p.ip4(inner + 16)} protocol {p.u8(inner + 9)} unreachable" if code == 2 else
                f"{p.ip4(inner + 16)} unreachable - need to frag" + (f" (mtu {mtu})" if mtu else ""))
    elif kind == 3:
        text = _UNREACH.get(code, "%s unreachable - #" + str(code)) % p.ip4(inner + 16)
    elif kind == 5:
        text = _REDIRECT.get(code, f"redirect-#{code} %s to %s") % (p.ip4(inner + 16), p.ip4(off + 4))
    elif kind == 11:
        p.need(inner + 16, 4, soft=True)
        text = {0: "time exceeded in-transit", 1: "ip reassembly time exceeded"}.get(code, f"time exceeded-#{code}")
    elif kind == 12:
        text = f"parameter problem - code {code}" if code else f"parameter problem - octet {p.u8(off + 4)}"
    elif kind == 18:
        text = f"address mask is 0x{p.u32(off + 8):08x}"
    elif kind == 13:
        text = f"time stamp query id {p.u16(off + 4)} seq {p.u16(off + 6)}"
    else:  # (router advertisements and time stamp replies carry more than is shown here)
        text = _ICMP.get(kind, f"type-#{kind}")
    p.add(f"ICMP {text}, length {plen}")


# ------------------------------------------------------------------------------------------ ICMPv6
# What follows the message's name, by type: each returns the text before ", length N", or None when tcpdump
# prints no length. They get the packet, the offset of the ICMPv6 header, its type, code and length.

def _unreach6(p: PrintState, off: int, kind: int, code: int, length: int) -> str | None:
    inner = off + 8
    p.add(", " + _UNREACH6.get(code, f"unknown unreach code ({code})"))
    if code in (0, 1, 3):
        return f" {p.ip6(inner + 24)}"
    if code == 2:
        return f" {p.ip6(inner + 24)}, source address {p.ip6(inner + 8)}"
    if code == 4:
        proto, dport = _upper_layer(p, inner)
        return f", {p.ip6(inner + 24)} " + (f"{'tcp' if proto == 6 else 'udp'} port {dport}" if proto in (6, 17)
                                            else f"protocol {proto} port {dport} unreachable")
    p.default_print(off, length, ascii=False)
    return None


def _time_exceeded6(p: PrintState, off: int, kind: int, code: int, length: int) -> str:
    return f" for {p.ip6(off + 32)}" if code == 0 else " (reassembly)" if code == 1 else f", unknown code ({code})"


def _param_problem6(p: PrintState, off: int, kind: int, code: int, length: int) -> str:
    p.need(off + 32, 16)
    return f", {_PARAMPROB6[code]} - octet {p.u32(off + 4)}" if code in _PARAMPROB6 else f", code-#{code}"


def _mld(p: PrintState, off: int, kind: int, code: int, length: int) -> str:
    if kind == 130 and length != 24:  # MLDv2 query
        if length < 28:
            return f" unknown-version (len {length}) "
        nsrcs = p.u16(off + 26)
        return f" v2 [gaddr {p.ip6(off + 8)}" + (
            "" if not nsrcs else " [invalid number of sources]" if length < 28 + 16 * nsrcs
            else f", {nsrcs} source(s)") + "]"
    if off + 24 <= p.end:  # MLDv1 (tcpdump puts no space before it)
        return f"max resp delay: {p.u16(off + 4)} addr: {p.ip6(off + 8)}"
    return ""


_ICMP6_BODY = {
    1: _unreach6,
    2: lambda p, off, kind, code, length: f", mtu {p.u32(off + 4)}",
    3: _time_exceeded6,
    4: _param_problem6,
    **dict.fromkeys((128, 129), lambda p, off, kind, code, length: f", id {p.u16(off + 4)}, seq {p.u16(off + 6)}"),
    **dict.fromkeys((130, 131, 132), _mld),
    135: lambda p, off, kind, code, length: ", who has " + p.ip6(off + 8),
    136: lambda p, off, kind, code, length: ", tgt is " + p.ip6(off + 8),
    137: lambda p, off, kind, code, length: f", {p.ip6(off + 24)} to {p.ip6(off + 8)}",
    143: lambda p, off, kind, code, length: f", {p.u16(off + 6)} group record(s)" if length >= 8
    else f" [invalid len {length}]",
    **dict.fromkeys((144, 146), lambda p, off, kind, code, length: f", id 0x{p.u16(off + 4):04x}"),
}


def icmp6(p: PrintState, off: int, length: int) -> None:
    p.proto = "icmp6"
    if length == 0:
        p.add("ICMP6, length 0 (invalid)")
        return
    kind = p.u8(off)
    p.add("ICMP6, " + _ICMP6.get(kind, f"unknown icmp6 type ({kind})"))
    code = p.u8(off + 1)
    body = _ICMP6_BODY.get(kind)
    text = body(p, off, kind, code, length) if body else ""
    if text is not None:
        p.add(f"{text}, length {length}")
    if kind not in _ICMP6_DECODED:   # (tcpdump shows the message of a type it does not know in hex)
        p.default_print(off, length, ascii=False)


def _upper_layer(p: PrintState, ip6: int) -> tuple[int, int]:
    """The protocol and destination port of a quoted IPv6 packet, past its extension headers."""
    p.need(ip6 + 6, 1, soft=True)
    nh, cp, hlen = p.u8(ip6 + 6), ip6, 40
    while cp + hlen + 4 <= p.end:
        cp += hlen
        if nh in (6, 17):
            return nh, p.u16(cp + 2)
        if nh not in _IP6_EXT_HEADERS or (nh == 44 and p.u16(cp + 2) & 0xFFF8):
            break
        nh, hlen = p.b[cp], 8 if nh == 44 else ((p.b[cp + 1] + 2) << 2) if nh == 51 else ((p.b[cp + 1] + 1) << 3)
    raise Truncated(soft=True)
