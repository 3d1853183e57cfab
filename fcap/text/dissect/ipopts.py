"""IP options as tcpdump prints them: IPv4's with -v (routes, timestamps, router alert), IPv6's hop-by-hop and
destination options (the jumbo payload length found among them; each option named with -v, the damage always)."""

from __future__ import annotations

from fcap.text.dissect.reader import PrintState

_IPOPT_NAMES = {0: "EOL", 1: "NOP", 68: "timestamp", 130: "security", 7: "RR", 137: "SSRR", 131: "LSRR", 148: "RA",
                82: "traceroute"}
_PAD1, _PADN, _ROUTER_ALERT, _JUMBO, _HOME_ADDRESS = 0, 1, 5, 0xC2, 0xC9


def ip4_options(p: PrintState, cp: int, length: int) -> bool:
    """tcpdump's ip_optprint; False when an option's bytes were not all captured."""
    sep = ""
    while length > 0:
        p.add(sep)
        sep, kind = ",", p.u8(cp)
        p.add(_IPOPT_NAMES.get(kind, f"unknown {kind}"))
        size = 1 if kind in (0, 1) else p.u8(cp + 1)
        if size < 2 and kind not in (0, 1) or size > length:
            p.add(f" [bad length {size}]")
            return True
        if cp + size > p.end:
            return False
        if kind == 0:
            return True
        if kind == 68:
            _ip4_timestamps(p, cp, size)
        elif kind in (7, 131, 137):
            _ip4_route(p, cp, size)
        elif kind == 148:
            if size < 4:
                p.add(f" [bad length {size}]")
            elif p.u16(cp + 2):
                p.add(f" value {p.u16(cp + 2)}")
        cp, length = cp + size, length - size
    return True


def _ip4_route(p: PrintState, cp: int, length: int) -> None:
    """A recorded or source route option's addresses, a comma after those already passed."""
    if length < 3:
        p.add(f" [bad length {length}]")
        return
    if (length + 1) & 3:
        p.add(f" [bad length {length}]")
    ptr = (p.b[cp + 2] - 1) & 0xFFFFFFFF   # (unsigned, as tcpdump's)
    if ptr < 3 or (ptr + 1) & 3 or ptr > length + 1:
        p.add(f" [bad ptr {p.b[cp + 2]}]")
    for at in range(3, length, 4):
        p.add(f" {p.ip4(cp + at)}" + ("," if ptr > at else ""))


def _ip4_timestamps(p: PrintState, cp: int, length: int) -> None:
    """The timestamp option, as tcpdump's ip_printts."""
    if length < 4:
        p.add(f"[bad length {length}]")
        return
    p.add(" TS{")
    kind, hoplen = p.b[cp + 3] & 15, 4 if p.b[cp + 3] & 15 == 0 else 8
    if (length - 4) & (hoplen - 1):
        p.add(f"[bad length {length}]")
    ptr, at = (p.b[cp + 2] - 1) & 0xFFFFFFFF, 0
    if ptr < 4 or (ptr - 4) & (hoplen - 1) or ptr > length + 1:
        p.add(f"[bad ptr {p.b[cp + 2]}]")
    if kind in (0, 1, 3):
        p.add({0: "TSONLY", 1: "TS+ADDR", 3: "PRESPEC"}[kind])
        at = 4
        while at < length:
            p.need(cp + at, hoplen)
            p.add((" ^ " if ptr == at else " ") + f"{p.u32(cp + at + hoplen - 4)}@"
                  + (p.ip4(cp + at) if hoplen == 8 else ""))
            at += hoplen
    else:
        p.add(f"[bad ts type {kind}]")
    p.add(" ^ " if ptr == at else "")
    hops = p.b[cp + 3] >> 4
    p.add(f" [{hops} hops not recorded]}} " if hops else "}")


def ip6_options(p: PrintState, off: int, length: int, plen: int | None):
    """tcpdump's ip6_opt_process over length bytes of options at off. plen: the IPv6 payload length of a
    hop-by-hop header (None: destination options, where a jumbo payload option is not valid). The valid jumbo
    payload length, None if there is none, False if the options are damaged (tcpdump then stops there)."""
    i, jumbo, seen, verbose = 0, None, False, p.verbose
    while i < length:
        kind = p.u8(off + i)
        if kind == _PAD1:
            size = 1
        elif i + 1 < length:
            size = p.u8(off + i + 1) + 2
        else:
            return False
        left = length - i
        if i + size > length:
            return False
        text = _ip6_option(p, off + i, kind, left)
        if text is False:
            return False
        if kind == _JUMBO:
            value = p.u32(off + i + 2)
            why = " - already seen" if seen else " - not a hop-by-hop option" if plen is None else \
                " - payload len != 0" if plen else " - < 65536" if value < 65536 else ""
            if not (seen or why):
                jumbo = value
            seen, text = True, f"(jumbo: {value}{why}) "
        if verbose:
            p.add(text)
        i += size
    if verbose:
        p.add(" ")
    return jumbo


def _ip6_option(p: PrintState, at: int, kind: int, left: int):
    """One option's text under -v (a jumbo payload's is made by the caller); False, with the damage printed,
    when it is cut short or of the wrong length."""
    name, need, size = {_PAD1: ("pad1", 1, None), _PADN: ("padn", 2, None), _ROUTER_ALERT: ("rtalert", 4, 2),
                        _JUMBO: ("jumbo", 6, 4), _HOME_ADDRESS: ("homeaddr", 18, 16)}.get(kind, (None, 2, None))
    if left < need:
        p.add(f"({name}: trunc)" if name else f"(type {kind}: trunc)")
        return False
    if size is not None and (p.b[at + 1] != size if kind != _HOME_ADDRESS else p.b[at + 1] < size):
        p.add(f"({name}: invalid len {p.b[at + 1]})")
        return False
    if kind in (_PAD1, _PADN):
        return f"({name})"
    if kind == _ROUTER_ALERT:
        return f"(rtalert: 0x{p.u16(at + 2):04x}) "
    if kind == _HOME_ADDRESS:
        return f"(homeaddr: {p.ip6(at + 2)})"
    if kind == _JUMBO:
        return ""
    return f"(opt_type 0x{kind:02x}: len={p.b[at + 1]})"
