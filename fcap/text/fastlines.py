"""`fcap -r FILE` printing a batch at a time (fcap.files.batches). The common packets' headers are decoded for the
whole batch with numpy: whole Ethernet frames with IPv4 without options or IPv6 without extension headers carrying
TCP (any options), UDP, an ICMP echo or port unreachable, ICMPv6 echo or neighbour discovery; ARP requests and
replies. Their lines come out of one %-format over the batch: a template per kind of line (its flow's text and its
second's made once), the values from the arrays. Every other packet's line is the Printer's, in its place, and what
must go in the packets' order (the table of relative sequence numbers, fcap.text.fastflows) runs in order, so the
text is the one `fcap -r` prints packet by packet, character for character."""

from __future__ import annotations

import functools
import socket

from fcap.defaults import NS, SNAPLEN
from fcap.live.fastmerge import distinct, items, np
from fcap.text.dissect import common
from fcap.text.dissect.common import M32
from fcap.text.dissect.reader import hex_lines
from fcap.text.dissect.transport import relative
from fcap.text.fastverbose import ECN as _ECN
from fcap.text.fastverbose import RangeSums, checked_text, checks, ip_headers, slow_rows
from fcap.text.printer import formatted_rows
from fcap.text import fastflows, headcols

SLOW, TCP, UDP, UDP_BAD, ICMP, UNREACH, ICMP6, ARP = range(8)
_TS_OPTION = 0x0101080A   # nop, nop, TS of length 10: the options of nearly every segment after the handshake
_inet_ntop, _AF_INET6 = socket.inet_ntop, socket.AF_INET6


class Columns:
    """One batch's decoded headers, a numpy array per value, a row per packet."""

    __slots__ = ("kind", "ver", "flags", "seq", "ack", "win", "urg", "hlen", "length", "extra", "tsval", "tsecr",
                 "sport", "dport", "mss", "wscale", "head", "check")

    def byte(self, offset: int):
        """Each packet's byte at `offset` (< HEAD; past its end: what follows, or 0 past the batch's end)."""
        return headcols.u8(self.head, offset)

    def word(self, offset: int):
        """Each packet's 16 bits at `offset`, in network order (as byte())."""
        return headcols.be16(self.head, offset)


HEAD = 96   # the bytes of each packet the common lines show anything of (an IPv6 SYN's options end at 94)
_TRANSPORT = HEAD - 54   # ... of them, those from the transport header's start an IPv6 packet has


def first_bytes(b, at, n: int):
    """Each packet's first n bytes (a row per packet; past the batch's end, zeros): one gather of n-byte items
    (fcap.live.fastmerge.items), no index per byte."""
    b = np.asarray(b, np.uint8)
    if len(at) and int(at.max()) + n > len(b):   # (a batch's data has zeros after it: fcap.files.batches)
        b = np.concatenate((b, np.zeros(n, np.uint8)))
    return items(b, n)[at].view(np.uint8).reshape(len(at), n)


def columns(fields, b, odd=None) -> Columns:
    """The kind of each packet of `fields` (SLOW where the Printer must make its line) and the values its line
    shows. b: the batch's bytes (fcap.files.batches.Batch.data, padded after the last packet); odd: packets to
    leave to the Printer whatever they are."""
    at = fields["at"]
    cap = fields["caplen"].astype(np.int64)
    head = first_bytes(b, at, HEAD)

    def u8(o):
        return headcols.u8(head, o)

    def u16(o):
        return headcols.be16(head, o)

    ok = (fields["linktype"] == 1) & (cap == fields["len"]) & (cap >= 42) & (cap <= SNAPLEN)
    if odd is not None:
        ok &= ~odd
    etype = u16(12)
    total, p4, plen, p6 = u16(16), u8(23), u16(18), u8(20)
    v4 = ok & (etype == 0x0800) & (u8(14) == 0x45) & (u16(20) & 0x1FFF == 0) & (total >= 20) \
        & (total <= cap - 14) & ((p4 == 1) | (p4 == 6) | (p4 == 17))
    v6 = ok & (etype == 0x86DD) & (cap >= 54) & (u8(14) >> 4 == 6) & (plen > 0) & (plen <= cap - 54) \
        & ((p6 == 6) | (p6 == 17) | (p6 == 58))
    proto = np.where(v4, p4, np.where(v6, p6, 0))
    off = np.where(v4, 34, 54)
    end = np.where(v4, 14 + total, 54 + plen)
    length = np.where(v4, total - 20, plen)
    c = _transport(head, v4, v6, proto, off, end, length, fragmented=v4 & (u8(20) & 0x20 != 0))
    c.head = head
    # ARP of Ethernet and IPv4, a request or a reply (fcap.text.dissect.link._arp's common case)
    arp = ok & (etype == 0x0806) & (u16(14) == 1) & (u16(16) == 0x0800) & (u16(18) == 0x0604) \
        & ((u16(20) == 1) | (u16(20) == 2))
    c.kind = np.where(arp, ARP, c.kind)
    told = ((headcols.be32(head, 32) | headcols.be16(head, 36)) != 0).astype(np.int64)   # (a target's MAC address)
    c.extra = np.where(arp, u16(20) | told << 8, c.extra)   # (the operation, the target's MAC told)
    c.length = np.where(arp, cap - 14, c.length)
    return c


def _transport(head, v4, v6, proto, off, end, length, fragmented) -> Columns:
    # the transport header's first bytes, after IPv4's header or IPv6's: one gather of each row's from its place
    th = items(head.ravel(), _TRANSPORT)[np.arange(len(head)) * HEAD + np.where(v4, 34, 54)]
    th = th.view(np.uint8).reshape(len(head), _TRANSPORT)

    def u8(o):
        return headcols.u8(th, o)

    def u16(o):
        return headcols.be16(th, o)

    def u32(o):
        return headcols.be32(th, o)

    ip = v4 | v6
    hlen = (u8(12) >> 4) * 4
    tcp = ip & (proto == 6) & (end >= off + 20) & (hlen >= 20) & (hlen <= length) & (off + hlen <= end)
    ulen = u16(4)
    udp = ip & (proto == 17) & (length >= 8) & (ulen >= 8)
    icmp_type = u8(0)
    icmp = v4 & (proto == 1) & ((icmp_type == 0) | (icmp_type == 8)) & (end >= off + 8)
    # a port unreachable quoting an IPv4 header without options and the ports after it
    quoted = u8(17)
    unreach = v4 & (proto == 1) & (icmp_type == 3) & (u8(1) == 3) & (length >= 32) & (u8(8) == 0x45) \
        & ((quoted == 6) | (quoted == 17))
    # ICMPv6 echo, neighbour solicitation and advertisement
    icmp6 = v6 & (proto == 58) & ((((icmp_type == 128) | (icmp_type == 129)) & (length >= 8)) |
                                  (((icmp_type == 135) | (icmp_type == 136)) & (length >= 24)))
    c = Columns()
    bad = udp & (ulen > length) & ~fragmented   # (its own length past the IP packet's: "bad length")
    c.kind = _first_of([tcp, bad, udp, icmp, unreach, icmp6], [TCP, UDP_BAD, UDP, ICMP, UNREACH, ICMP6], SLOW)
    c.ver = np.where(v4, 4, 6)
    # ports; an echo's id and sequence number in their place, the quoted datagram's protocol and port
    echo = icmp | icmp6
    c.sport = np.where(echo, u16(4), np.where(unreach, quoted, u16(0)))
    c.dport = np.where(echo, u16(6), np.where(unreach, u16(30), u16(2)))
    c.seq, c.ack, c.flags, c.win, c.urg = u32(4), u32(8), u8(13), u16(14), u16(18)
    ts = tcp & (hlen == 32) & (u32(20) == _TS_OPTION)
    syn = tcp & (hlen == 40) & (u16(20) == 0x0204) & (u16(24) == 0x0402) & (u16(26) == 0x080A) & (u8(36) == 1) \
        & (u16(37) == 0x0303)   # (mss, sackOK, TS, nop, wscale: a SYN's)
    c.hlen = np.where(ts, -1, np.where(syn, -2, np.where(tcp, hlen, 0)))   # -1, -2: option lists laid out by template
    c.tsval, c.tsecr = np.where(syn, u32(28), u32(24)), np.where(syn, u32(32), u32(28))
    c.mss, c.wscale = u16(22), u8(39)
    # after the header: TCP's payload length; UDP's own length field's, less its header (the IP packet's in
    # length's place for a bad one); ICMP's message length, the echo's type in extra
    c.length = np.where(tcp, length - hlen, np.where(udp, length - 8, length))
    c.extra = np.where(udp, ulen - 8, icmp_type)   # (ICMP's: its type)
    return c


def _first_of(conditions, values, default):
    """numpy.select of scalar values: each row's value of the first condition true in it (~5 times cheaper)."""
    out = np.full(len(conditions[0]), default, np.int64)
    for condition, value in zip(reversed(conditions), reversed(values)):
        out[condition] = value
    return out


def batch_text(summarizer, fields, b, data: bytes, slow, odd=None, points=None) -> list:
    """The lines of one batch, each ending in a newline, as pieces of ASCII bytes (of str where a text in them is
    not ASCII, a point's name or a Printer's line: Printer.write_batch writes them; fcap.text.printer.formatted_rows):
    the common packets' made with %-formats over the batch (a template per kind of line, the values from the
    arrays), the others' by slow(i) (the Printer's text for packet i) in their places, and those of `odd` (a mask)
    too. data: the batch's bytes as bytes; points: each line's text after its time (a numpy array of str, each
    ending in a space), or None. The summarizer's time is one without a state (Summarizer.stateless_time()); its
    verbose count (-v) adds the IP headers' text and the checksums (fcap.text.fastverbose)."""
    verbose = summarizer.verbose
    c = columns(fields, b, odd)
    if verbose:
        _verbose_rows(c, fields, b, verbose, summarizer.checksums)
    at = fields["at"]
    options = _odd_options(c, at, data)
    fast = c.kind != SLOW
    ip = fast & (c.kind != ARP)
    flows = fastflows.flows(c, ip, (c.kind == TCP) | (c.kind == UDP) | (c.kind == UDP_BAD))
    texts = _in_order(summarizer, c, fields, data, slow, flows)
    heads, us = _heads(summarizer, fields["ts_ns"])
    parts = np.empty((len(c.kind), 4 if verbose else 3), object)
    parts[:, 0] = heads if points is None else heads + points
    parts[:, -2] = _prefix_texts(c, fields, data, flows, ip, verbose)
    header = None
    if verbose:   # (the header's text and values go between the time's and the line's)
        parts[:, 1], *header = ip_headers(c.head, ip & (c.ver == 4), ip & (c.ver == 6))
    parts[:, -1], values, starts = _bodies(c, us, options, verbose, header)
    for i, text in texts.items():
        parts[i] = (text.replace("%", "%%"),) + ("",) * (parts.shape[1] - 1)
    return formatted_rows(parts, values, starts)


def _verbose_rows(c: Columns, fields, b, verbose: int, checksums: bool) -> None:
    """-v: the rows left to the printers (those -v shows more of than a template: a port unreachable other than
    _quoted_plain's, neighbour discovery with other options, a reset's text, a UDP length past its packet, IPv4
    fragments and wrong header checksums) and every row's transport checksum (c.check; not TCP's or UDP's without
    checksums, -K)."""
    kind = c.kind
    v4 = (kind != SLOW) & (kind != ARP) & (c.ver == 4)
    # (neighbour discovery with no option, or one link-layer address: its template, _neighbours)
    nd_plain = (c.length == 24) | (c.length == 32) & ((c.byte(78) == 1) | (c.byte(78) == 2)) & (c.byte(79) == 1)
    other = (kind == UNREACH) & ~_quoted_plain(c, verbose) | (kind == UDP_BAD) \
        | ((kind == ICMP6) & (c.extra >= 135) & ~nd_plain) | ((kind == TCP) & (c.flags & 0x04 != 0) & (c.length > 0))
    kind[other | slow_rows(c.head, v4)] = SLOW
    c.check = checks(c.head, fields["at"].astype(np.int64), RangeSums(b, padded=True), v4, kind == TCP, kind == UDP,
                     (kind == ICMP) | (kind == UNREACH), kind == ICMP6, verbose)
    if not checksums:
        c.check = c.check._replace(state=np.where((kind == TCP) | (kind == UDP), 0, c.check.state))


def _odd_options(c: Columns, at, data: bytes) -> dict[int, str]:
    """The option lists other than the two laid out by template, as fcap.text.dissect.common prints them, by row;
    a row whose list it does not print (None) becomes SLOW."""
    rows = np.flatnonzero((c.kind == TCP) & (c.hlen > 20))
    out = {}
    parse = common._options
    for i, a, ver, h in zip(rows.tolist(), at[rows].tolist(), c.ver[rows].tolist(), c.hlen[rows].tolist()):
        t = a + (34 if ver == 4 else 54)
        text = parse(data, t + 20, t + h)
        if text is None:
            c.kind[i] = SLOW
        else:
            out[i] = text.replace("%", "%%")
    return out


def _in_order(summarizer, c: Columns, fields, data: bytes, slow, flows) -> dict[int, str]:
    """What must run in the packets' order: the Printer's packets (which may use and change the table of
    sequence numbers) and the relative numbers of the segments with an ACK (tcpdump's, fcap.text.dissect.common's,
    in the same table), filled into c.seq and c.ack. The Printer's texts by row. The Printer's packets run first,
    watched; where none of them touched a connection the batch's segments are in, the segments' numbers are
    made for the whole batch at once (fastflows.relative_numbers), else all goes packet by packet, in order."""
    seqs, kind = summarizer.seqs, c.kind
    acked = (kind == TCP) & (c.flags & 0x10 != 0) if seqs is not None else np.zeros(len(kind), bool)
    if not acked.any():
        return {i: slow(i) for i in np.flatnonzero(kind == SLOW).tolist()}
    flow, rev, keys = fastflows.tcp_flows(c, fields, data, acked, flows)
    rows, slow_rows = np.flatnonzero(acked), np.flatnonzero(kind == SLOW)
    ids = np.flatnonzero(np.bincount(flow[rows], minlength=len(keys)))
    if len(seqs) + len(ids) + 2 * len(slow_rows) <= _MAX_CONVERSATIONS:   # (no clearing of the table on the way)
        watched = summarizer.seqs = fastflows.Watched(seqs)
        try:
            texts = {i: slow(i) for i in slow_rows.tolist()}
        finally:
            summarizer.seqs = seqs
        if watched.touched.isdisjoint(keys[i] for i in ids.tolist()):
            fastflows.relative_numbers(seqs, c, rows, flow, rev, keys)
            return texts
        watched.undo()
    return _one_by_one(seqs, c, flow, rev, keys, acked, slow)


_MAX_CONVERSATIONS = 100_000   # (the Summarizer's bound on its table: it clears it past this)


def _one_by_one(seqs: dict, c: Columns, flow, rev, keys, acked, slow) -> dict[int, str]:
    """_in_order's way packet by packet, in order."""
    kind = c.kind
    rows = np.flatnonzero((kind == SLOW) | acked)
    texts = {}
    seq, ack = c.seq.tolist(), c.ack.tolist()
    for i, k, cid, r, f in zip(rows.tolist(), kind[rows].tolist(), flow[rows].tolist(), rev[rows].tolist(),
                               c.flags[rows].tolist()):
        if k == SLOW:
            texts[i] = slow(i)
            continue
        if len(seqs) > _MAX_CONVERSATIONS:
            seqs.clear()
        seq[i], ack[i], _ = relative(seqs, keys[cid], r, seq[i], ack[i], f)
    c.seq, c.ack = np.array(seq, np.int64), np.array(ack, np.int64)
    return texts


def _heads(summarizer, ts_ns) -> tuple:
    """Each line's time as a template ("HH:MM:SS.%06d ", as Summarizer.when() makes it, the second's text once per
    second; "" with -t) and the fraction for it (None with -t)."""
    if summarizer.time_style == "none":
        return "", None
    sec, ns = np.divmod(ts_ns, NS)
    first, ids = distinct(sec)
    seconds = sec[first]
    nano = summarizer.precision == "nano"
    frac = "%09d " if nano else "%06d "
    table = np.array([summarizer.second_text(s).replace("%", "%%") + frac for s in seconds.tolist()], object)
    return table[ids.ravel()], ns if nano else ns // 1000


def _quoted_plain(c: Columns, verbose: int):
    """The port unreachables whose -v lines a template makes (with -v, not -vv): quoting a whole UDP datagram
    (the ICMP message ends where its IP length says), not a fragment, its header's checksum right, its UDP length
    within it."""
    total, ulen = c.word(44), c.word(66)
    words = headcols.sum16(c.head, 42, 10)
    return (verbose == 1) & (c.sport == 17) & (total == c.length - 8) & (c.word(48) & 0x3FFF == 0) \
        & (words % 0xFFFF == 0) & (words != 0) & (ulen >= 8) & (ulen <= total - 20)


def _prefix_texts(c: Columns, fields, data: bytes, flows: fastflows.Flows, ip, verbose: int = 0):
    """Each IP row's flow: "IP a.p > b.q: " (fcap.text.dissect.common's text, made once per flow; with -v without
    "IP ", which begins the header's text); "" on others."""
    texts = []
    known = common._prefixes
    first = flows.first
    ported = (flows.words[first, 4] >> np.uint64(32) & np.uint64(1)).astype(bool)
    for row, a, ver, p in zip(first.tolist(), fields["at"][first].tolist(), c.ver[first].tolist(), ported.tolist()):
        if not ip[row]:
            texts.append("")
            continue
        key = data[a + 26:a + (38 if p else 34)] if ver == 4 else data[a + 22:a + (58 if p else 54)]
        text = (known.get(key) or common._prefix(key, data[a:a + 58], ver, p)).replace("%", "%%")
        texts.append(text[(3 if ver == 4 else 4):] if verbose else text)
    return np.array(texts, object)[flows.row]


def _bodies(c: Columns, us, options: dict[int, str], verbose: int = 0, header=None) -> tuple:
    """Each fast row's template after its flow, from the kind of line it is, the values of the batch's templates in
    order and where each row's start (_values)."""
    variant = _variants(c, verbose)
    first, vid = distinct(variant)
    plans = [_plan(v) for v in variant[first].tolist()]
    bodies = np.array([p[0] for p in plans], object)[vid]
    for i, text in options.items():
        if c.kind[i] == TCP:
            bodies[i] = bodies[i].replace("%%OPTIONS%%", text)
    _neighbours(c, bodies, verbose)
    return (bodies, *_values(c, plans, vid, us, header, verbose))


def _variants(c: Columns, verbose: int):
    """Each row's kind of line (_plan's variant): its kind, its checksum's state and what tells its kind's lines
    apart (TCP's flags, what follows them and its options; a port unreachable's quoted protocol and, with -v, its
    header's; the others' type)."""
    kind, f = c.kind, c.flags
    span = np.where(c.length > 0, 2, np.where((f & 0x07 != 0) | (verbose > 1), 1, 0))
    opt = np.where(c.hlen == -1, 1, np.where(c.hlen == -2, 2, np.where(c.hlen > 20, 3, 0)))
    check = c.check.state if verbose else np.zeros(len(kind), np.int64)
    check = np.where(kind == ARP, 1 if verbose else 0, check)   # (-v: ARP's long form)
    quoted = c.sport | (c.byte(43) & 3) << 8 | (c.byte(50) > 0) << 10 | (c.byte(48) >> 6) << 11 if verbose \
        else c.sport   # (-v: the quoted header's ECN, whether it has a TTL, DF and the reserved bit)
    return kind << 20 | check << 16 | np.where(kind == TCP, f | span << 8 | opt << 10,
                                               np.where(kind == UNREACH, quoted, c.extra & 0x3FF))


def _values(c: Columns, plans: list, vid, us, header, verbose: int):
    """The values of the batch's templates in order, row after row, and where each row's start: the time's
    fraction, the IP header's values where `header` shows them (-v: values and which are shown,
    fcap.text.fastverbose.ip_headers), then its template's, picked by its plan's columns (vid: each row's plan)
    from the named columns and the head's bytes: a gather per plan and column, of its rows (grouped by one sort)."""
    n, kind = len(c.kind), c.kind
    counts = np.array([len(p[1]) for p in plans], np.intp)
    mine = counts[vid]
    lead = np.zeros(n, np.intp) if us is None else (kind != SLOW).astype(np.intp)
    if header is not None:
        values, present = header
        lead = lead + present.sum(axis=1)
    start = np.cumsum(lead + mine) - (lead + mine)
    picked = np.empty(int(start[-1] + lead[-1] + mine[-1]) if n else 0, np.int64)
    if us is not None:
        picked[start[kind != SLOW]] = us[kind != SLOW]
    if header is not None:
        before = (start + (us is not None))[:, None] + np.cumsum(present, axis=1) - present   # (each one's place)
        for k in range(values.shape[1]):
            picked[before[present[:, k], k]] = values[present[:, k], k]
    by_plan = np.argsort(vid, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(vid, minlength=len(plans))))).tolist()
    base, named = start + lead, _Named(c)
    for p, (_body, cols) in enumerate(plans):
        if not cols or bounds[p] == bounds[p + 1]:
            continue
        rows = by_plan[bounds[p]:bounds[p + 1]]
        at = base[rows]
        for q, m in enumerate(cols):
            picked[at + q] = named[m][rows] if m < _HEAD_AT else c.head[rows, m - _HEAD_AT]
    return picked, start


class _Named(dict):
    """The named columns of a batch's Columns by their place in _NAMED, each made once when a plan first asks."""

    def __init__(self, c: Columns):
        super().__init__()
        self.c = c

    def __missing__(self, m: int):
        got = self[m] = _MAKE[m](self.c)
        return got


# the values a template names (_plan's columns by their place here) and how a batch's Columns give each: -v's
# from "field" on (the checksum's, and the header a port unreachable quotes)
_NAMED = {"seq": lambda c: c.seq, "end": lambda c: (c.seq + c.length) & M32, "ack": lambda c: c.ack,
          "win": lambda c: c.win, "urg": lambda c: c.urg, "tsval": lambda c: c.tsval, "tsecr": lambda c: c.tsecr,
          "mss": lambda c: c.mss, "wscale": lambda c: c.wscale, "length": lambda c: c.length,
          "extra": lambda c: c.extra, "id": lambda c: c.sport, "seqno": lambda c: c.dport,
          "field": lambda c: c.check.field, "should": lambda c: c.check.should, "qid": lambda c: c.word(46),
          "qtotal": lambda c: c.word(44), "qsport": lambda c: c.word(62), "qlength": lambda c: c.word(66) - 8}
_NAMES, _MAKE = tuple(_NAMED), tuple(_NAMED.values())
_HEAD_AT = 1 << 10   # a plan's column from here: the head's byte (column - _HEAD_AT)


@functools.lru_cache(maxsize=4096)
def _plan(variant: int) -> tuple[str, tuple]:
    """A kind of line's template and its values' columns (_bodies' named columns by their place in _NAMED, the
    head's bytes from _HEAD_AT); a SLOW row's none."""
    if variant >> 20 == SLOW:
        return "", ()
    template, names = _template(variant)
    return template, tuple(_NAMES.index(m) if isinstance(m, str) else _HEAD_AT + m for m in names)


_IP4 = "%d.%d.%d.%d"
_MAC = "%02x:%02x:%02x:%02x:%02x:%02x"
_ICMP6_NAMES = {128: "echo request", 129: "echo reply", 135: "neighbor solicitation", 136: "neighbor advertisement"}


def _template(variant: int) -> tuple[str, tuple]:
    """The template of a kind of line after its flow, and its values in order: names of Columns' arrays, or
    offsets of bytes from the packet's start. variant: the kind << 20, a checksum's state (fcap.text.fastverbose;
    ARP's long form: 1) << 16, and what tells the kind's lines apart."""
    kind, check, sub = variant >> 20, variant >> 16 & 15, variant & 0xFFFF
    if kind == TCP:
        return _tcp_template(sub, check)
    if kind == UDP:
        before, names = checked_text("udp", check)
        return before + "UDP, length %d\n", (*names, "extra")
    if kind == UDP_BAD:
        return "UDP, bad length %d > %d\n", ("extra", "length")
    if kind == ICMP:
        after, names = checked_text("icmp", check)
        return f"ICMP echo {'request' if sub == 8 else 'reply'}, id %d, seq %d, length %d{after}\n", \
            ("id", "seqno", "length", *names)
    if kind == UNREACH:
        return _unreach_template(sub, check)
    if kind == ICMP6 and sub >= 135:   # (its template has the target's address: _neighbours)
        return "", (*checked_text("icmp6", check)[1], "length")
    if kind == ICMP6:
        before, names = checked_text("icmp6", check)
        if check:   # (-v: no length after an echo's fields)
            return f"{before}ICMP6, {_ICMP6_NAMES[sub]}, id %d, seq %d\n", (*names, "id", "seqno")
        return f"ICMP6, {_ICMP6_NAMES[sub]}, id %d, seq %d, length %d\n", ("id", "seqno", "length")
    arp = "ARP, Ethernet (len 6), IPv4 (len 4), " if check else "ARP, "
    if sub & 0xFF == 2:   # ARP
        return f"{arp}Reply {_IP4} is-at {_MAC}, length %d\n", (28, 29, 30, 31, 22, 23, 24, 25, 26, 27, "length")
    if sub >> 8:
        return f"{arp}Request who-has {_IP4} ({_MAC}) tell {_IP4}, length %d\n", \
            (38, 39, 40, 41, 32, 33, 34, 35, 36, 37, 28, 29, 30, 31, "length")
    return f"{arp}Request who-has {_IP4} tell {_IP4}, length %d\n", (38, 39, 40, 41, 28, 29, 30, 31, "length")


def _unreach_template(sub: int, check: int) -> tuple[str, tuple]:
    """A port unreachable's line; with -v (sub > 0xFF) its checksum if wrong and the UDP datagram it quotes (its
    header's ECN, TTL and flags in sub), as fcap.text.dissect prints them."""
    head = f"ICMP {_IP4} {'tcp' if sub & 0xFF == 6 else 'udp'} port %d unreachable, length %d"
    names = (58, 59, 60, 61, "seqno", "length")
    if sub <= 0xFF and not check:
        return head + "\n", names
    after, more = checked_text("icmp", check)
    ttl = bool(sub >> 10 & 1)
    flags = ", ".join(name for bit, name in ((1, "DF"), (2, "rsvd")) if sub >> 11 & bit) or "none"
    quoted = (f"\n\tIP (tos 0x%x{_ECN[sub >> 8 & 3]}" + (", ttl %d" if ttl else "")
              + f", id %d, offset 0, flags [{flags}], proto UDP (17), length %d)\n    {_IP4}.%d > {_IP4}.%d: UDP,"
              " length %d\n")
    return head + after + quoted, (*names, *more, 43, *((50,) if ttl else ()), "qid", "qtotal", 54, 55, 56, 57,
                                   "qsport", 58, 59, 60, 61, "seqno", "qlength")


def _tcp_template(sub: int, check: int = 0) -> tuple[str, tuple]:
    flags, span, opt = sub & 0xFF, sub >> 8 & 3, sub >> 10 & 3
    cksum, names = checked_text("tcp", check)
    text, names = [f"Flags [{common._FLAGS[flags]}]", cksum], list(names)
    if span:
        text.append(", seq %d:%d" if span == 2 else ", seq %d")
        names += ["seq", "end"] if span == 2 else ["seq"]
    if flags & 0x10:
        text.append(", ack %d")
        names.append("ack")
    text.append(", win %d")
    names.append("win")
    if flags & 0x20:
        text.append(", urg %d")
        names.append("urg")
    if opt == 1:
        text.append(", options [nop,nop,TS val %d ecr %d]")
        names += ["tsval", "tsecr"]
    elif opt == 2:
        text.append(", options [mss %d,sackOK,TS val %d ecr %d,nop,wscale %d]")
        names += ["mss", "tsval", "tsecr", "wscale"]
    elif opt == 3:
        text.append("%%OPTIONS%%")
    text.append(", length %d\n")
    names.append("length")
    return "".join(text), tuple(names)


def _neighbours(c: Columns, bodies, verbose: int = 0) -> None:
    """A neighbour solicitation's or advertisement's template, its target address in it (once per address; with
    -v, its checksum's state, an advertisement's flags and its link-layer address option as well)."""
    nd = np.flatnonzero((c.kind == ICMP6) & (c.extra >= 135))
    if not len(nd):
        return
    head = c.head[nd]
    target = np.ascontiguousarray(head[:, 62:78])
    kinds = c.extra[nd]
    more = np.zeros(len(nd), np.uint64)
    if verbose:   # (the check's state, the flags' byte, the option's 8 bytes: _verbose_rows let only one through)
        option = np.ascontiguousarray(head[:, 78:86]).view(">u8").ravel().astype(np.uint64)
        more = option * (c.length[nd] > 24).astype(np.uint64)
        kinds = kinds | c.check.state[nd] << 8 | head[:, 58].astype(np.int64) << 16
    words = np.column_stack((target.view(">u8").astype(np.uint64), kinds.astype(np.uint64), more))
    number, first = fastflows.ids(words)
    texts = []
    for row, k in zip(first.tolist(), kinds[first].tolist()):
        what = "who has" if k & 0xFF == 135 else "tgt is"
        address = _inet_ntop(_AF_INET6, target[row].tobytes())
        if not verbose:
            texts.append(f"ICMP6, {_ICMP6_NAMES[k]}, {what} {address}, length %d\n")
            continue
        texts.append(_nd_verbose(k, what, address, bytes(head[row, 78:86]) if c.length[nd[row]] > 24 else b"",
                                 verbose))
    bodies[nd] = np.array(texts, object)[number]


_NA_FLAGS = ((0x80, "router"), (0x40, "solicited"), (0x20, "override"))


def _nd_verbose(k: int, what: str, address: str, option: bytes, verbose: int) -> str:
    """-v's template of a neighbour discovery message (k: its type, check state << 8, flags' byte << 16), as
    fcap.text.dissect.icmp6_nd prints it (-vv: the option's bytes in hex too): values the checksum's and the
    length."""
    before, _ = checked_text("icmp6", k >> 8 & 0xFF)
    text = f"{before}ICMP6, {_ICMP6_NAMES[k & 0xFF]}, length %d, {what} {address}"
    if k & 0xFF == 136:
        text += ", Flags [" + (", ".join(name for bit, name in _NA_FLAGS if k >> 16 & bit) or "none") + "]"
    if option:
        name = "source link-address" if option[0] == 1 else "destination link-address"
        text += f"\n\t  {name} option ({option[0]}), length 8 (1): {option[2:].hex(':')}"
        if verbose > 1:
            text += "\n\t    " + hex_lines(option[2:])[1:]
    return text + "\n"
