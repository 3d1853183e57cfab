"""A batch's flows (fcap.text.fastlines): each row's flow and TCP connection numbered among the batch's, by a hash of
its addresses and ports checked against them, and tcpdump's relative sequence numbers of a batch's segments made
for all at once."""

from __future__ import annotations

from fcap.live.fastmerge import distinct, np
from fcap.text.dissect.common import M32
from fcap.text.dissect.transport import conversation


class Watched:
    """The table of relative sequence numbers as the Printer's packets see it when they run ahead of the batch's
    segments: the keys they read or wrote, and what the written ones held before (undo() puts it back)."""

    _MISSING = object()

    def __init__(self, table: dict) -> None:
        self.table, self.touched, self.before = table, set(), {}

    def get(self, key, default=None):
        self.touched.add(key)
        return self.table.get(key, default)

    def __setitem__(self, key, value) -> None:
        self.touched.add(key)
        self.before.setdefault(key, self.table.get(key, self._MISSING))
        self.table[key] = value

    def __len__(self) -> int:
        return len(self.table)

    def clear(self) -> None:   # (not reached: _in_order leaves room for the packets it watches)
        raise AssertionError("the table was to have room")

    def undo(self) -> None:
        for key, value in self.before.items():
            if value is self._MISSING:
                del self.table[key]
            else:
                self.table[key] = value


def relative_numbers(seqs: dict, c, rows, flow, rev, keys) -> None:
    """fcap.text.dissect.transport.relative over the segments of `rows` (in order) at once: each connection's base
    is the one its last SYN, or its first segment where the table has none, set at or before the segment; the
    segments that set one keep their numbers; the table ends with each connection's last base."""
    n = len(rows)
    order = np.lexsort((np.arange(n), flow[rows]))   # (by connection, in order within each)
    rows = rows[order]
    conn, back = flow[rows], rev[rows]
    seq, ack = c.seq[rows], c.ack[rows]
    start = np.ones(n, bool)
    start[1:] = conn[1:] != conn[:-1]
    first = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    known = [seqs.get(key) for key in keys]   # (per connection; conn: numbers among keys)
    table = np.array([k or (0, 0) for k in known], np.int64).reshape(len(keys), 2)[conn]
    had = np.array([k is not None for k in known], bool)[conn]
    sets = (c.flags[rows] & 0x02 != 0) | (start & ~had)
    last = np.maximum.accumulate(np.where(sets, np.arange(n), -1))
    below = (ack - 1) & M32
    own0, own1 = np.where(back, below, seq), np.where(back, seq, below)   # (the base a segment sets)
    since = last >= first
    at = np.maximum(last, 0)
    base0, base1 = np.where(since, own0[at], table[:, 0]), np.where(since, own1[at], table[:, 1])
    c.seq[rows] = np.where(sets, seq, (seq - np.where(back, base1, base0)) & M32)
    c.ack[rows] = np.where(sets, ack, (ack - np.where(back, base0, base1)) & M32)
    end = np.ones(n, bool)
    end[:-1] = start[1:]
    for cid, b0, b1 in zip(conn[end & since].tolist(), base0[end & since].tolist(), base1[end & since].tolist()):
        seqs[keys[cid]] = (b0, b1)


class Flows:
    """A batch's flows: each IP row's number among the distinct addresses and ports (TCP's and UDP's) of the batch's
    rows, direction kept (a line's flow text, and the TCP connections: tcp_flows), the first row of each, and
    the words that tell them apart (source, destination address: two each, _addresses; a tag of the version,
    whether there are ports, and the ports)."""

    __slots__ = ("row", "first", "words")


def flows(c, ip, ports) -> Flows:
    """The Flows of the rows of `ip` (fcap.text.fastlines.Columns), with their ports where `ports`."""
    f = Flows()
    tag = c.ver.astype(np.uint64) << np.uint64(33) | ports.astype(np.uint64) << np.uint64(32)
    f.words = np.where(ip[:, None], np.column_stack(
        (*_addresses(c), tag | np.where(ports, c.sport << 16 | c.dport, 0).astype(np.uint64))), np.uint64(0))
    f.row, f.first = ids(f.words)
    return f


def tcp_flows(c, fields, data: bytes, rows, flows: Flows) -> tuple:
    """For the segments of `rows`: their connection's number (either direction), whether they go the reverse way
    (the greater port, or address, first: common._tcp's rule) and the table's key of each connection; made once
    per flow of flows that has such a segment (a row of it), and given to its rows."""
    has = np.zeros(len(flows.first), bool)
    has[flows.row[rows]] = True
    segmented = np.flatnonzero(has)
    first = flows.first[segmented]
    words = flows.words[first]
    src, dst = words[:, 0:2], words[:, 2:4]
    sport, dport = c.sport[first].astype(np.uint64), c.dport[first].astype(np.uint64)
    rev = (sport > dport) | ((sport == dport) & ((src[:, 0] > dst[:, 0]) | ((src[:, 0] == dst[:, 0]) &
                                                                           (src[:, 1] > dst[:, 1]))))
    lo, hi = np.where(rev[:, None], dst, src), np.where(rev[:, None], src, dst)
    ports = np.where(rev, dport << np.uint64(16) | sport, sport << np.uint64(16) | dport)
    conn, start = ids(np.column_stack((lo, hi, ports | c.ver[first].astype(np.uint64) << np.uint64(32))))
    keys = []
    for row in first[start].tolist():   # (each connection's key as the printers make it, from a segment of it)
        a, ver = int(fields["at"][row]), int(c.ver[row])
        srcb, dstb = (data[a + 26:a + 30], data[a + 30:a + 34]) if ver == 4 else \
            (data[a + 22:a + 38], data[a + 38:a + 54])
        keys.append(conversation(srcb, dstb, int(c.sport[row]), int(c.dport[row]))[0])
    conn_of, rev_of = np.zeros(len(has), np.intp), np.zeros(len(has), bool)
    conn_of[segmented], rev_of[segmented] = conn, rev
    return conn_of[flows.row], rev_of[flows.row], keys


def _addresses(c) -> tuple:
    """Each IP row's source and destination address as two big-endian words each, compared as the bytes are
    (IPv4's as an IPv4-mapped IPv6 address), from the head; what the rows of other packets hold is no address."""
    head, v4 = c.head, c.ver == 4

    def word(o: int, n: int):
        return head[:, o:o + n].view(">u8" if n == 8 else ">u4")[:, 0].astype(np.uint64)

    mapped = np.uint64(0xFFFF << 32)
    src = np.column_stack((np.where(v4, 0, word(22, 8)), np.where(v4, mapped | word(26, 4), word(30, 8))))
    dst = np.column_stack((np.where(v4, 0, word(38, 8)), np.where(v4, mapped | word(30, 4), word(46, 8))))
    return src, dst


_MIX = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5,
                 0xFF51AFD7ED558CCD], np.uint64)


def ids(words) -> tuple:
    """Each row's number among the distinct rows of `words` (uint64 columns) and the first row of each: by a hash,
    checked against the words themselves (a collision: by the words)."""
    h = np.zeros(len(words), np.uint64)
    for k in range(words.shape[1]):
        h = (h ^ words[:, k]) * _MIX[k % len(_MIX)]
        h ^= h >> np.uint64(29)
    first, inverse = distinct(h)
    if (words[first][inverse] != words).any():
        _, first, inverse = np.unique(words, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    return inverse, first
