"""What tcpdump -v adds to ICMPv6 neighbour discovery: a router advertisement's fields, a neighbour
advertisement's flags, and the options of each message (link-layer addresses, prefixes, MTU, DNS servers...)."""

from __future__ import annotations

import socket

from fcap.text.dissect.reader import PrintState, Truncated, hex_lines

OPTIONS_AT = {133: 8, 134: 16, 135: 24, 136: 24, 137: 40}   # where each message's options start
_OPTION_NAMES = {1: "source link-address", 2: "destination link-address", 3: "prefix info", 4: "redirected header",
                 5: "mtu", 25: "rdnss", 31: "dnssl", 7: "advertisement interval", 8: "homeagent information",
                 24: "route info"}
_RA_FLAGS = ((0x80, "managed"), (0x40, "other stateful"), (0x20, "home agent"), (0x02, "ipv6 only"))
_NA_FLAGS = ((0x80000000, "router"), (0x40000000, "solicited"), (0x20000000, "override"))
_PI_FLAGS = ((0x80, "onlink"), (0x40, "auto"), (0x20, "router"))
_RTPREF = ("medium", "high", "rsv", "low")


def _flags(value: int, table) -> str:
    return ", ".join(name for bit, name in table if value & bit) or "none"


def _lifetime(v: int) -> str:
    return "infinity" if v == 0xFFFFFFFF else f"{v}s"


def _unknown(p: PrintState, at: int, n: int, indent: str) -> str:
    """tcpdump's print_unknown_data: what was captured of n bytes at at, in hex, each line after indent."""
    data = p.b[at:min(at + n, p.end)]
    return "".join(indent + line[1:] for line in hex_lines(data).split("\n")) if data else ""


def nd_verbose(p: PrintState, off: int, kind: int, length: int) -> None:
    """The -v part of a neighbour discovery message of type kind at off (its name, length and target printed)."""
    if kind == 134:
        hops, flags = p.u8(off + 4), p.u8(off + 5)
        p.add(f"\n\thop limit {hops}, Flags [{_flags(flags, _RA_FLAGS)}], pref {_RTPREF[(flags & 0x18) >> 3]},"
              f" router lifetime {p.u16(off + 6)}s, reachable time {p.u32(off + 8)}ms,"
              f" retrans timer {p.u32(off + 12)}ms")
    elif kind == 136:
        p.add(f", Flags [{_flags(p.u32(off + 4), _NA_FLAGS)}]")
    start = off + OPTIONS_AT[kind]
    if not _options(p, start, length - OPTIONS_AT[kind]):
        raise Truncated(soft=True)


def _options(p: PrintState, start: int, resid: int) -> bool:
    """tcpdump's icmp6_opt_print: each option on a line of its own; False when one was cut short."""
    cp = start
    while cp < p.end:
        if cp + 2 > p.end:
            return False
        if resid <= 0:
            return True
        kind, units = p.b[cp], p.b[cp + 1]
        size = units << 3
        if units == 0 or cp + size > p.end:
            return False
        p.add(f"\n\t  {_OPTION_NAMES.get(kind, 'unknown')} option ({kind}), length {size} ({units}): ")
        text = _option(p, cp, kind, units, start)
        if text is None:   # (an option tcpdump has no printer for: in hex, and the rest not printed, but for -vv)
            if p.verbose <= 1:
                p.add(_unknown(p, cp + 2, size - 2, "\n\t  "))
                return True
        else:
            p.add(text)
        if p.verbose > 1:
            p.add(_unknown(p, cp + 2, size - 2, "\n\t    "))
        cp, resid = cp + size, resid - size
    return True


def _option(p: PrintState, cp: int, kind: int, units: int, start: int) -> str | None:
    size = units << 3
    if kind in (1, 2):
        return p.b[cp + 2:cp + size].hex(":")
    if kind == 3:
        return (f"{p.ip6(cp + 16)}/{p.u8(cp + 2)}{'badlen' if units != 4 else ''},"
                f" Flags [{_flags(p.u8(cp + 3), _PI_FLAGS)}], valid time {_lifetime(p.u32(cp + 4))},"
                f" pref. time {_lifetime(p.u32(cp + 8))}")
    if kind == 4:   # (tcpdump dumps from the first option, not this one)
        return _unknown(p, start, size, "\n\t    ")
    if kind == 5:
        return f" {p.u32(cp + 4)}{'bad option length' if units != 1 else ''}"
    if kind == 25:
        return f" lifetime {p.u32(cp + 4)}s," + "".join(f" addr: {p.ip6(cp + 8 + 16 * i)}"
                                                       for i in range((units - 1) // 2))
    if kind == 7:
        return f" {p.u32(cp + 4)}ms"
    if kind == 8:
        return f" preference {p.u16(cp + 4)}, lifetime {p.u16(cp + 6)}"
    if kind == 24:
        if units > 3:
            raise Truncated(soft=True)
        p.need(cp + 4, 4)
        prefix = (p.b[cp + 8:cp + 8 * units] + bytes(16))[:16]
        return (f" {socket.inet_ntop(socket.AF_INET6, prefix)}/{p.u8(cp + 2)},"
                f" pref={_RTPREF[(p.u8(cp + 3) & 0x18) >> 3]}, lifetime={_lifetime(p.u32(cp + 4))}")
    if kind == 31:
        return f" lifetime {p.u32(cp + 4)}s, domain(s):" + _domains(p, cp + 8, cp + size)
    return None


def _domains(p: PrintState, at: int, end: int) -> str:
    """DNSSL's names, each as tcpdump's fqdn_print writes it ("example.com.")."""
    names = []
    while at < end and p.u8(at) != 0:
        labels = []
        while (n := p.u8(at)) != 0:
            if n > 63:
                raise Truncated(soft=True)
            p.need(at + 1, n)
            labels.append(p.b[at + 1:at + 1 + n].decode("ascii", "replace"))
            at += n + 1
        names.append(" " + ".".join(labels) + ".")
        at += 1
    return "".join(names)
