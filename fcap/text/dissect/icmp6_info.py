"""ICMPv6 node information (RFC 4620), router renumbering (RFC 2894) and RPL (RFC 6550) as tcpdump -nn prints them.

Each printer gets the packet, the offset of the ICMPv6 header, its type, code and length, prints what follows
the message's name and returns "" (icmp6 adds ", length N"). A field tcpdump checks before printing it and finds
not captured prints " [|icmp6]" and ends the message's text (the length still follows); one it reads unchecked ends
the packet (Truncated), as tcpdump's GET_ macros do.
"""

from __future__ import annotations

from fcap.text.dissect.reader import PrintState

_TRUNC = " [|icmp6]"

# ------------------------------------------------------------------------------------------ node information
# the ICMPv6 header (type, code, checksum, qtype, flags), the 8-byte nonce, then the subject or the reply data
_NI_QTYPE, _NI_FLAGS, _NI_DATA = 4, 6, 16
_NI_WHO_ARE_YOU = 12            # a KAME who-are-you request: the header and 4 bytes
_NI_QUERY, _NI_REPLY = 139, 140
_QTYPE_NOOP, _QTYPE_SUPTYPES, _QTYPE_FQDN, _QTYPE_NODEADDR = 0, 1, 2, 3
_SUBJ_IPV6, _SUBJ_FQDN, _SUBJ_IPV4 = 0, 1, 2
_NI_SUCCESS, _NI_REFUSED, _NI_UNKNOWN = 0, 1, 2
# node addresses flags, as tcpdump prints them: the query's, then the reply's (which adds T, truncated)
_NODEADDR_FLAGS = ((0x40, "a"), (0x20, "G"), (0x10, "S"), (0x08, "L"), (0x04, "C"), (0x02, "A"))
_NODEADDR_REPLY_FLAGS = (*_NODEADDR_FLAGS, (0x01, "T"))
_ADDR_TTL_LEN = 4 + 16          # a reply's node address: TTL, address


def node_information(p: PrintState, off: int, kind: int, code: int, length: int) -> str:
    siz = p.end - off
    if kind == _NI_QUERY:
        _ni_query(p, off, code, siz)
    elif length > siz or siz < _NI_DATA:   # (a reply must be captured whole)
        p.add(_TRUNC)
    else:
        _ni_reply(p, off, code, siz)
    return ""


def _ni_query(p: PrintState, off: int, code: int, siz: int) -> None:
    if siz == _NI_WHO_ARE_YOU:
        p.add(" who-are-you request")
        return
    p.add(" node information query")
    if siz < _NI_DATA:
        p.add(_TRUNC)
        return
    qtype, flags = p.u16(off + _NI_QTYPE), p.u16(off + _NI_FLAGS)
    p.add(" (" + _qtype_text(qtype, flags, _NODEADDR_FLAGS))
    if qtype in (_QTYPE_NOOP, _QTYPE_SUPTYPES):
        p.add(")")
        return
    if siz == _NI_DATA:   # icmp-name-lookup-03
        p.add(", 03 draft)")
        return
    cp = off + _NI_DATA
    if code == _SUBJ_IPV6:
        if siz == _NI_DATA + 16:
            p.add(f", subject={p.ip6(cp)}")
    elif code == _SUBJ_IPV4:
        if siz == _NI_DATA + 4:
            p.add(f", subject={p.ip4(cp)}")
    elif code == _SUBJ_FQDN:
        p.add(", subject=DNS name")
        _name(p, cp)
    else:
        p.add(", unknown subject")
    p.add(")")


def _qtype_text(qtype: int, flags: int, names: tuple) -> str:
    if qtype == _QTYPE_SUPTYPES:
        return "supported qtypes" + (f" [{'C' if flags & 1 else ''}]" if flags else "")
    if qtype == _QTYPE_NODEADDR:
        return "node addresses" + _nodeaddr_flags(flags, names)
    return {_QTYPE_NOOP: "noop", _QTYPE_FQDN: "DNS name"}.get(qtype, "unknown")


def _nodeaddr_flags(flags: int, names: tuple) -> str:
    return " [" + "".join(c for bit, c in names if flags & bit) + "]" if flags else ""


def _ni_reply(p: PrintState, off: int, code: int, siz: int) -> None:
    p.add(" node information reply (" + {_NI_REFUSED: "refused", _NI_UNKNOWN: "unknown"}.get(code, ""))
    if code != _NI_SUCCESS:
        p.add(")")
        return
    qtype, flags = p.u16(off + _NI_QTYPE), p.u16(off + _NI_FLAGS)
    if qtype == _QTYPE_FQDN:
        p.add("DNS name")
        _name(p, off + _NI_DATA + 4)    # after the TTL
        if flags & 1:
            p.add(f" [TTL={p.u32(off + _NI_DATA)}]")
    elif qtype == _QTYPE_NODEADDR:
        p.add("node addresses")
        for i in range(_NI_DATA, siz - _ADDR_TTL_LEN + 1, _ADDR_TTL_LEN):
            p.add(f" {p.ip6(off + i + 4)}({p.u32(off + i)})")
        p.add(_nodeaddr_flags(flags, _NODEADDR_REPLY_FLAGS))
    else:
        p.add(_qtype_text(qtype, flags, _NODEADDR_REPLY_FLAGS))
    p.add(")")


def _name(p: PrintState, cp: int) -> None:
    """A subject or reply name: a Pascal string (icmp-name-lookup-03) or DNS labels, to the end of the capture."""
    if p.u8(cp) == p.end - cp - 1:
        p.add(', "' + "".join(_char(c) for c in p.b[cp + 1:p.end]) + '"')
    else:
        _dns_name(p, cp)


def _dns_name(p: PrintState, cp: int) -> None:
    """tcpdump's dnsname_print: labels without compression; "???" where they do not fit."""
    ep, out = p.end, [', "']
    while cp < ep:
        n = p.b[cp]
        cp += 1
        if not n:
            out.append("." if cp == ep else "" if cp + 1 == ep and p.b[cp] == 0 else "???")
            break
        if n > ep - cp:
            out.append("???")
            break
        out.append("".join(_char(c) for c in p.b[cp:cp + n]))
        cp += n
        if cp + 1 < ep and p.b[cp]:
            out.append(".")
    p.add("".join(out) + '"')


def _char(c: int) -> str:
    """tcpdump's fn_print_char: M- for the high bit, ^ for a control character (DEL: ^?)."""
    meta = "M-" if c & 0x80 else ""
    c &= 0x7F
    return meta + (chr(c) if 0x20 <= c < 0x7F else "^" + chr(c ^ 0x40))


# ------------------------------------------------------------------------------------------ router renumbering
# the ICMPv6 header (its data: the sequence number), segment, flags, max delay, reserved; then, in a command, a
# match-prefix part (code, length in 8-byte units, ordinal, match length, min, max, reserved, prefix) and use-prefix
# parts (use length, keep length, RA mask, RA flags, valid and preferred lifetimes, flags, prefix)
_RR_SEQ, _RR_RESERVED, _RR_BODY = 4, 12, 16
_RR_CODES = {0: "command", 1: "result", 255: "sequence number reset"}
_RR_COMMAND = 0
_MATCH_CODE, _MATCH_LEN, _MATCH_MATCHLEN, _MATCH_PREFIX, _MATCH_SIZE = 0, 1, 3, 8, 24
_MATCH_CODES = {1: "add", 2: "change", 3: "setglobal"}
_USE_USELEN, _USE_KEEPLEN, _USE_FLAGS, _USE_PREFIX, _USE_SIZE = 0, 1, 12, 16, 32
# tcpdump tests the flags' first byte against htonl(0x80000000) and htonl(0x40000000): on a little-endian
# machine, as this one, the bits 0x80 and 0x40 of that byte
_USE_FLAG_BITS = ((0x80, "V"), (0x40, "P"))


def router_renumbering(p: PrintState, off: int, kind: int, code: int, length: int) -> str:
    if off + _RR_BODY > p.end:
        p.add(_TRUNC)
        return ""
    p.add(", " + _RR_CODES.get(code, f"code-#{code}") + f", seq={p.u32(off + _RR_SEQ)}")
    if code != _RR_COMMAND:
        return ""
    match = off + _RR_BODY
    if match + _MATCH_PREFIX + 16 > p.end:
        p.add(_TRUNC)
        return ""
    mcode = p.b[match + _MATCH_CODE]
    p.add(f" match({_MATCH_CODES.get(mcode, f'#{mcode}')},{p.ip6(match + _MATCH_PREFIX)}/"
          f"{p.b[match + _MATCH_MATCHLEN]})")
    n = p.b[match + _MATCH_LEN] - 3
    if n < 0 or n % 4:
        p.add(_TRUNC)
        return ""
    use = match + _MATCH_SIZE
    for _ in range(n // 4):
        if use + _USE_PREFIX + 16 > p.end:
            p.add(_TRUNC)
            return ""
        flags = p.b[use + _USE_FLAGS]
        p.add(" use(" + ("".join(c for bit, c in _USE_FLAG_BITS if flags & bit) + "," if flags else "")
              + f"{p.ip6(use + _USE_PREFIX)}/{p.b[use + _USE_USELEN]}/{p.b[use + _USE_KEEPLEN]})")
        use += _USE_SIZE
    return ""


# ------------------------------------------------------------------------------------------ RPL
# tcpdump names the message by its code (the high bit: secured, which it does not decode) and, without -v, no more
_RPL_SECURED = 0x80
_RPL_CODES = {0: "DODAG Information Solicitation", 1: "DODAG Information Object",
              2: "Destination Advertisement Object", 3: "Destination Advertisement Object Ack"}


def rpl(p: PrintState, off: int, kind: int, code: int, length: int) -> str:
    if code & _RPL_SECURED:
        return ", (SEC) [worktodo]"
    return ", (CLR)" + _RPL_CODES.get(code, f"RPL message, unknown code {code}")
