"""ICMPv6 messages, as tcpdump -nn prints them (node information, router renumbering and RPL in icmp6_info)."""

from __future__ import annotations

from fcap.text.dissect.cksum import shouldbe, transport_cksum
from fcap.text.dissect.icmp6_info import node_information, router_renumbering, rpl
from fcap.text.dissect.icmp6_nd import OPTIONS_AT, nd_verbose
from fcap.text.dissect.reader import PrintState, Truncated

_ICMP6 = {1: "destination unreachable", 2: "packet too big", 3: "time exceeded in-transit", 4: "parameter problem",
          128: "echo request", 129: "echo reply", 130: "multicast listener query", 131: "multicast listener report",
          132: "multicast listener done", 133: "router solicitation", 134: "router advertisement",
          135: "neighbor solicitation", 136: "neighbor advertisement", 137: "redirect", 138: "router renumbering",
          139: "who-are-you request", 140: "who-are-you reply", 141: "inverse neighbor solicitation",
          142: "inverse neighbor advertisement", 143: "multicast listener report v2", 144: "ha discovery request",
          145: "ha discovery reply", 146: "mobile router solicitation", 147: "mobile router advertisement",
          155: "RPL", 200: "mtrace response", 201: "mtrace message"}
_UNREACH6 = {0: "unreachable route", 1: " unreachable prohibited", 2: "beyond scope", 3: "unreachable address",
             4: "unreachable port"}
_PARAMPROB6 = {0: "erroneous", 1: "next header", 2: "option", 3: "incomplete header chain"}
_ICMP6_DECODED = frozenset((1, 2, 3, 4, 155, *range(128, 148)))   # the types tcpdump's icmp6_print has a case for
_LENGTH_FIRST = frozenset((133, 134, 135, 136, 137, 145, 147))   # -v prints their length after their name
_IP6_EXT_HEADERS = (0, 43, 60, 51, 44)  # hop-by-hop, routing, destination options, AH, fragment


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
    138: router_renumbering,
    **dict.fromkeys((139, 140), node_information),
    155: rpl,
}


def icmp6(p: PrintState, off: int, length: int, ip_off: int, fragmented: int = 0) -> None:
    p.proto = "icmp6"
    if off + 2 <= p.end:
        p.layer("icmp6", type=p.b[off], code=p.b[off + 1])
    if length == 0:
        p.add("ICMP6, length 0 (invalid)")
        return
    if p.verbose and not fragmented and off + length <= p.end:
        field, computed = p.u16(off + 2), transport_cksum(p, ip_off, 6, off, length, 58)
        p.add(f"[bad icmp6 cksum 0x{field:04x} -> 0x{shouldbe(field, computed):04x}!] " if computed
              else "[icmp6 sum ok] ")
    kind = p.u8(off)
    p.add("ICMP6, " + _ICMP6.get(kind, f"unknown icmp6 type ({kind})"))
    if p.verbose and kind in _LENGTH_FIRST:
        p.add(f", length {length}")
    code = p.u8(off + 1)
    body = _ICMP6_BODY.get(kind)
    text = body(p, off, kind, code, length) if body else ""
    if kind not in _ICMP6_DECODED:   # (tcpdump shows the message of a type it does not know in hex, but for -vv)
        p.add(f", length {length}")
        if p.verbose <= 1:
            p.default_print(off, length, ascii=False)
    elif text is not None:
        p.add(text if p.verbose else f"{text}, length {length}")
        if p.verbose and kind in OPTIONS_AT:
            nd_verbose(p, off, kind, length)


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
