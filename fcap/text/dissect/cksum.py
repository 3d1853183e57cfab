"""Internet checksums as tcpdump -v checks them: the IPv4 header's, and TCP's, UDP's, ICMP's and ICMPv6's over
their pseudo-headers (the final destination of a source route, as tcpdump's ip_finddst and ip6_finddst find it)."""

from __future__ import annotations

from fcap.text.dissect.reader import PrintState, Truncated

_LSRR, _SSRR = 131, 137
_IP6_SKIPPED = (0, 60, 62, 135)    # hop-by-hop, destination options, mobility (old and new): a length byte
_IP6_FRAGMENT, _IP6_ROUTING = 44, 43


def ones_sum(data: bytes) -> int:
    """The one's complement sum of data's 16-bit big-endian words (an odd last byte padded with a zero): the
    number the words make is that sum modulo 0xFFFF, as 2**16 is 1 modulo 0xFFFF."""
    if len(data) & 1:
        data += b"\0"
    n = int.from_bytes(data, "big")
    r = n % 0xFFFF
    return 0xFFFF if r == 0 and n else r


def in_cksum(data: bytes) -> int:
    """tcpdump's in_cksum: 0 when data (its checksum field included) is right."""
    return ~ones_sum(data) & 0xFFFF


def shouldbe(field: int, computed: int) -> int:
    """tcpdump's in_cksum_shouldbe: the checksum field's right value, from its value and in_cksum's result."""
    s = field + computed
    s = (s & 0xFFFF) + (s >> 16)
    return (s & 0xFFFF) + (s >> 16)


def transport_cksum(p: PrintState, ip_off: int, ver: int, off: int, length: int, proto: int) -> int:
    """in_cksum over a transport header and its data (length bytes at off, all captured) behind the pseudo-header
    of the IP header at ip_off."""
    if ver == 4:
        dst = _ip4_final_dst(p, ip_off)
        head = p.b[ip_off + 12:ip_off + 16] + dst + bytes((0, proto)) + (length & 0xFFFF).to_bytes(2, "big")
    else:
        head = p.b[ip_off + 8:ip_off + 24] + _ip6_final_dst(p, ip_off) + length.to_bytes(4, "big") \
            + bytes((0, 0, 0, proto))
    return in_cksum(head + p.b[off:off + length])


def _ip4_final_dst(p: PrintState, ip_off: int) -> bytes:
    """The last address of a loose or strict source route among the options, else the destination."""
    length = (p.b[ip_off] & 15) * 4 - 20
    cp = ip_off + 20
    while length > 0:
        kind = p.u8(cp)
        if kind == 0:
            break
        size = 1 if kind == 1 else p.u8(cp + 1)
        if size < 2 and kind != 1 or length < size or cp + size > p.end:
            break
        if kind in (_LSRR, _SSRR) and size >= 7:
            return p.b[cp + size - 4:cp + size]
        cp, length = cp + size, length - size
    return p.b[ip_off + 16:ip_off + 20]


def _ip6_final_dst(p: PrintState, ip_off: int) -> bytes:
    """The final destination of a type 0 or 2 routing header (its last address) or a segment routing header (its
    first segment), else the destination; read no further than the capture."""
    dst = p.b[ip_off + 24:ip_off + 40]
    nh, cp, advance = p.b[ip_off + 6], ip_off, 40
    try:
        while cp < p.end:
            cp += advance
            if nh in _IP6_SKIPPED:
                advance, nh = (p.u8(cp + 1) + 1) << 3, p.u8(cp)
            elif nh == _IP6_FRAGMENT:
                advance, nh = 8, p.u8(cp)
            elif nh == _IP6_ROUTING:
                p.need(cp, 8)
                n, kind = p.b[cp + 1], p.b[cp + 2]
                if kind in (0, 2) and n % 2 == 0:
                    for i in range(n // 2):
                        p.need(cp + 8 + 16 * i, 16)
                        dst = p.b[cp + 8 + 16 * i:cp + 24 + 16 * i]
                elif kind == 4 and n % 2 == 0:
                    p.need(cp + 8, 16)
                    dst = p.b[cp + 8:cp + 24]
                break
            else:
                break
    except Truncated:
        pass
    return dst
