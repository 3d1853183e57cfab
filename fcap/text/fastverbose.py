"""What -v adds to the common lines fcap.text.fastlines makes a batch at a time, computed for the whole batch with
numpy: the IP header's text ("IP (tos 0x0, ttl 64, id 1, offset 0, flags [DF], proto TCP (6), length 60)" and the
line's break, or IPv6's "(hlim 64, next-header TCP (6) payload length: 40) "), one template per kind of header with
its values from the arrays, and the checksums of TCP, UDP, ICMP and ICMPv6 (one's complement sums of each packet's
range: numpy's reduceat over the batch's 32-bit words at two alignments, RangeSums). The text is the one the
printers (fcap.text.dissect) write; what the batch does not cover goes back to them (slow_rows)."""

from __future__ import annotations

from typing import NamedTuple

from fcap.live.fastmerge import distinct, np
from fcap.text.dissect.ip import IPPROTO_NAMES
from fcap.text.headcols import be16 as _u16
from fcap.text.headcols import sum16
from fcap.text.headcols import u8 as _u8

ECN = ("", ",ECT(1)", ",ECT(0)", ",CE")   # (what -v adds to the TOS for its low bits)
NONE, CORRECT, INCORRECT, NO_CKSUM = range(4)   # a checksum: not shown, right, wrong, absent (UDP over IPv4)


class Checks(NamedTuple):
    """Each row's transport checksum: its state (NONE...), the field's value and the value it should hold."""

    state: object
    field: object
    should: object


def slow_rows(head, v4) -> object:
    """IPv4 rows the printers must make with -v: with more fragments (no transport checksum then, by tcpdump's
    rule) or a wrong header checksum."""
    more_fragments = v4 & (_u8(head, 20) & 0x20 != 0)
    words = sum16(head, 14, 10)
    return more_fragments | v4 & (_fold(words) != 0xFFFF)


def _fold(s):
    """One's complement sums (as exact integers) folded to 16 bits: their remainder modulo 0xFFFF, 0xFFFF for a
    non-zero multiple."""
    r = s % 0xFFFF
    return np.where((r == 0) & (s != 0), 0xFFFF, r)


class RangeSums:
    """One's complement sums of the big-endian 16-bit words of ranges of the batch's bytes, an odd last byte padded
    with zero, as _fold reads them: a value congruent to the words' sum modulo 0xFFFF, zero only where that sum is.
    Each range is added as the machine's own (little-endian) 32-bit words that cover it, by numpy's reduceat over
    the batch seen as words (one pass, no copy of the batch, no array as long as it; 16-bit words cost ~4 times more,
    a big-endian view ~35 times), less the bytes of its first and last words outside it: an exact sum of its bytes,
    each times 256 ** (its offset modulo 4), zero only where they all are. 2**16 is 1 modulo 0xFFFF, so that sum is
    congruent to the bytes' little-endian 16-bit words at even offsets; the big-endian words from an even start are
    256 times those, from an odd start those themselves (RFC 1071's byte order independence)."""

    def __init__(self, b, padded: bool = False) -> None:
        """b: the bytes; padded: b holds 8 bytes or more after every range (a batch's data: fcap.files.batches
        pads it), else they are added (a copy)."""
        a = np.asarray(b, np.uint8)   # (its words cast to 64 bits a group of ranges at a time: _GROUP)
        self.a = a if padded else np.concatenate((a, np.zeros(8, np.uint8)))

    def __call__(self, start, length):
        a, start, length = self.a, start.astype(np.int64), length.astype(np.int64)
        end = start + length
        first, last = start >> 2, (end + 3) >> 2   # (the words that cover each range: [first, last))
        out = np.zeros(len(start), np.uint64)
        rows = np.flatnonzero(length > 0)
        view = a[:4 * (len(a) // 4)].view("<u4")
        k, e = first[rows], last[rows]
        for g in range(0, len(rows), _GROUP):   # (reduceat's cast copy of the words each group spans: small)
            kg, eg = k[g:g + _GROUP], e[g:g + _GROUP]
            lo, hi = int(kg.min()), int(eg.max())
            bounds = np.empty(2 * len(kg), np.int64)
            bounds[0::2], bounds[1::2] = kg - lo, eg - lo
            out[rows[g:g + _GROUP]] = np.add.reduceat(view[lo:hi + 1], bounds, dtype=np.uint64)[0::2]
        outside = np.zeros(len(start), np.uint64)
        for j in range(3):   # (the bytes before each range in its first word, and after it in its last)
            for at, inside in ((4 * first + j, 4 * first + j < start), (end + j, end + j < 4 * last)):
                pick = np.flatnonzero(inside & (length > 0))
                outside[pick] += a[at[pick]].astype(np.uint64) << (8 * (at[pick] & 3)).astype(np.uint64)
        out -= outside
        return _fold(np.where(start & 1 == 0, out * np.uint64(256), out)).astype(np.int64)


_GROUP = 4096   # ranges summed by one reduceat: the words they span cast to 64 bits, ~1 MB for packets of ~500
# bytes (a cast of the whole batch's words, ~18 MB, cost ~0.2 s of the kernel's huge page faults the first time)


def _pseudo(head, v4, proto, length):
    """The pseudo-header's sum (as sum16's, congruent modulo 0xFFFF): addresses, protocol and length (IPv4's or
    IPv6's)."""
    s4, s6 = sum16(head, 26, 4), sum16(head, 22, 16)
    return np.where(v4, s4 + proto + length, s6 + (length >> 16) + (length & 0xFFFF) + proto)


def checks(head, at, sums: RangeSums, v4, tcp, udp, icmp, icmp6, verbose: int) -> Checks:
    """The transport checksum of every row, as -v (verbose: its count) shows it."""
    n = len(at)
    off = np.where(v4, 34, 54)
    iplen = np.where(v4, _u16(head, 16) - 20, _u16(head, 18))
    ulen = np.where(v4, _u16(head, 38), _u16(head, 58))
    covered = np.where(udp, ulen, iplen)
    proto = np.select([tcp, udp], [6, 17], 58)
    pseudo = np.where(icmp, 0, _pseudo(head, v4, proto, covered))
    rows = tcp | udp | icmp | icmp6
    total = np.zeros(n, np.int64)
    idx = np.flatnonzero(rows)
    total[idx] = sums(at[idx] + off[idx], covered[idx]) + pseudo[idx]
    computed = ~_fold(total) & 0xFFFF
    field = np.select([tcp, udp], [_field(head, v4, 16), _field(head, v4, 6)], _field(head, v4, 2))
    should = _fold(field + computed)   # (tcpdump's in_cksum_shouldbe: the end-around carry is the remainder)
    ok = computed == 0
    state = np.where(rows, np.where(ok, CORRECT, INCORRECT), NONE)
    state = np.where(udp & v4, np.where(verbose > 1, np.where(field == 0, NO_CKSUM, state), NONE), state)
    return Checks(state, field, should)


def _field(head, v4, o):
    """A 16-bit field at offset o of the transport header."""
    return np.where(v4, _u16(head, 34 + o), _u16(head, 54 + o))


def ip_headers(head, v4, v6) -> tuple:
    """Each row's IP header text as a template (object array, "" on others) and its values (an (n, 4) matrix and
    which of them are the template's)."""
    n = len(v4)
    tos, ttl, ident, total, flags, proto = _u8(head, 15), _u8(head, 22), _u16(head, 18), _u16(head, 16), \
        _u8(head, 20) >> 5, _u8(head, 23)
    cls, flow = (_u8(head, 14) & 15) << 4 | _u8(head, 15) >> 4, (_u8(head, 15) & 15) << 16 | _u16(head, 16)
    hlim, nh, plen = _u8(head, 21), _u8(head, 20), _u16(head, 18)
    # (a variant per header text: what seldom changes is in the text, the id, flow label and length are values)
    variant = np.select([v4, v6], [_V4 | tos | ttl << 8 | flags << 16 | proto << 19,
                                   _V6 | cls | (flow > 0) << 8 | nh << 9 | hlim << 17], 0)
    values = np.where(v4[:, None], np.column_stack((tos, ttl, ident, total)),
                      np.column_stack((cls, flow, hlim, plen)))
    present = np.zeros((n, 4), bool)
    texts = np.full(n, "", object)
    first, inverse = distinct(variant)
    kinds = variant[first]
    table, shown = [], []
    for v in kinds.tolist():
        text, mask = _header_template(v)
        table.append(text)
        shown.append(mask)
    texts[:] = np.array(table, object)[inverse]
    present[:] = np.array(shown, bool).reshape(-1, 4)[inverse]
    return texts, values, present


_FRAG = ((1, "+"), (2, "DF"), (4, "rsvd"))


_V4, _V6 = 1 << 40, 2 << 40   # ip_headers' variants: IPv4's, IPv6's


def _header_template(v: int) -> tuple[str, tuple]:
    """The header text of a variant (ip_headers) and which of its four values it shows."""
    if v >> 40 == 1:
        tos, ttl, flags, proto = v & 0xFF, v >> 8 & 0xFF, v >> 16 & 7, v >> 19 & 0xFF
        names = ", ".join(name for bit, name in _FRAG if flags & bit) or "none"
        return (f"IP (tos 0x{tos:x}{ECN[tos & 3]}" + (f", ttl {ttl}" if ttl else "")
                + f", id %d, offset 0, flags [{names}], proto {IPPROTO_NAMES.get(proto, 'unknown')} ({proto}),"
                " length %d)\n    "), (False, False, True, True)
    if v >> 40 == 2:
        cls, flow, nh, hlim = v & 0xFF, bool(v >> 8 & 1), v >> 9 & 0xFF, v >> 17 & 0xFF
        return ("IP6 (" + (f"class 0x{cls:02x}, " if cls else "") + ("flowlabel 0x%05x, " if flow else "")
                + f"hlim {hlim}, next-header {IPPROTO_NAMES.get(nh, 'unknown')} ({nh}) payload length: %d) "), \
            (False, flow, False, True)
    return "", (False, False, False, False)


def checked_text(kind: str, state: int) -> tuple[str, tuple]:
    """What a checksum adds to a line of kind "tcp" (after its flags), "udp" or "icmp6" (before the protocol's
    name) or "icmp" (after the length), and the names of its values ("field", "should")."""
    if state == NONE or kind == "icmp" and state == CORRECT:
        return "", ()
    if kind == "tcp":
        return (", cksum 0x%04x (correct)", ("field",)) if state == CORRECT else \
            (", cksum 0x%04x (incorrect -> 0x%04x)", ("field", "should"))
    if kind == "icmp":
        return " (wrong icmp cksum %x (->%x)!)", ("field", "should")
    if state == NO_CKSUM:
        return "[no cksum] ", ()
    name = "udp" if kind == "udp" else "icmp6"
    return (f"[{name} sum ok] ", ()) if state == CORRECT else \
        (f"[bad {name} cksum 0x%04x -> 0x%04x!] ", ("field", "should"))
