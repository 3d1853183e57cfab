"""The perf buffer's records found and read at C speed (numpy), for the file drain (fcap.live.drain.FileDrain): a
ring's records follow one another, each's size in its header, so where they are is a chain; a run of records of one
size (a flood of one kind of packet) is found with one array operation, the rest a record at a time over the
headers alone. Each record's timestamp is then read as an array, and its file record located (pcap: the program
laid out its header) or planned for a whole ring at once (pcapng: the Enhanced Packet Block's options come from
the drain's cache, one entry per metadata key, as in the per-record walk). merge() sorts the CPUs' records by time
(fcap.live.fastmerge's order) and copies each file record once, straight to its place in the pass's buffer. A
pass with a record only Python can lay out (bytes not contiguous: `fast` 0) is left to the per-record walk.
Samples may hold `lead` bytes before their META (--dump's area, a multiple of 8): the cache's key holds them too."""

from __future__ import annotations

from typing import Callable

from fcap.defaults import BLOCK_CACHE_BYTES, BLOCK_CACHE_MAX
from fcap.kernel.layout import META, META_SIZE, PCAP_REC
from fcap.live.fastmerge import U64, Plan, items, lengths_of, np, ordered, words

SAMPLE, LOST = 9, 2             # PerfRecord (bpf.uapi)
RAW = 12                        # perf_event_header + the raw sample's u32 size: the sample's bytes start here
_TS = RAW + META.off("ts")
_FAST = RAW + META.off("fast")
assert _TS % 4 == 0 and _FAST % 4 == 0 and META.end("ts") - META.off("ts") == 8
# pcapng's cache key: whole u64s, every field user space reads but ts and id among them (fcap.kernel.layout.meta_fields)
_KEY_AT, _KEY_LEN = RAW + META.off("skb"), META.off("fast") - META.off("skb")
_IFACE, _ID = RAW + META.off("iface"), RAW + META.off("id")   # an EPB's header after its first 8 bytes; packet id
_MUL = U64(0x100000001B3)
RUN_MIN = 16      # a uniform run shorter than this: the next LOOP records are found one at a time
LOOP = 256


class RingRecords:
    """One ring's records in a pass: `seg`, its bytes from tail to head (a view of the ring, or a copy where they
    wrap around its end); per sample its offset in seg, `fast`, its timestamp and the ring position where it ends,
    and once located or laid out (pcap(), epb()) where its file record lies in `out` and its length (planned only,
    planned_epb(): its length, its entry in the block cache and its header's and bytes' length, `body`); LOST records
    as (end position, count); `end`, where the walk stopped; `simple`: every sample's bytes contiguous."""

    __slots__ = ("seg", "rel", "fast", "ts", "out", "at", "size", "ends", "lost", "start", "end", "simple", "lead",
                 "entry", "body")

    def __init__(self, start: int, lead: int = 0):
        self.start = self.end = start
        self.lead = lead
        self.seg = self.out = None
        self.rel = self.fast = self.ts = self.at = self.size = self.ends = self.entry = self.body = _NONE
        self.lost: list = []
        self.simple = True

    def __len__(self) -> int:
        return len(self.ts)


def read(ring, address: int, lead: int = 0) -> RingRecords:
    """The records pending in `ring` (bpf.perfbuf's, whose data bytes lie at `address`), each sample's META after
    `lead` bytes."""
    tail, head = ring.span()
    out = RingRecords(tail, lead)
    if tail >= head:
        return out
    mem = words(address, ring.size // 8).view(np.uint8)
    t, h = tail & ring.mask, ((head - 1) & ring.mask) + 1
    seg = mem[t:h] if t < h else np.concatenate((mem[t:], mem[:h]))
    rel, end = _positions(seg.view(np.uint64), head - tail)
    out.end = tail + end
    out.seg = seg
    if len(rel):
        _fields(out, seg, rel, tail)
    return out


def _positions(seg64, length: int):
    """Where each record starts, from the region's start (bytes), and where the walk ended: uniform runs as one
    array each, the rest one record at a time."""
    parts = []
    pos = 0
    while pos < length:
        stride, run = _uniform(seg64, pos, length)
        if len(run) >= RUN_MIN or len(run) and pos + len(run) * stride >= length:
            parts.append(run)
            pos += len(run) * stride
            continue
        found, pos, corrupt = _loop(seg64, pos, length)
        parts.append(found)
        if corrupt:
            break
    return (np.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else _NONE, pos


def _uniform(seg64, pos: int, length: int):
    """The first record's size, and the records from `pos` on that have it, up to the first that does not."""
    stride = int(seg64[pos >> 3]) >> 48
    if stride < 8 or stride & 7:
        return stride, _NONE
    rel = np.arange(pos, length, stride, dtype=np.int64)
    sizes = seg64[rel >> 3] >> np.uint64(48)
    off = np.flatnonzero(sizes != np.uint64(stride))
    return stride, (rel[:off[0]] if len(off) else rel)


def _loop(seg64, pos: int, length: int):
    """Up to LOOP records from `pos`, found over their headers; and whether a corrupt size ended the walk."""
    found = []
    q = memoryview(seg64).cast("B").cast("Q")
    try:
        for _ in range(LOOP):
            if pos >= length:
                break
            size = q[pos >> 3] >> 48
            if size < 8:   # corrupt: give up on this ring's backlog
                return np.array(found, np.int64), length, True
            found.append(pos)
            pos += size
    finally:
        q.release()
    return np.array(found, np.int64), pos, False


def _fields(out: RingRecords, seg, rel, tail: int) -> None:
    """Timestamps, pcap bytes and ends of the samples at `rel`; LOST records' counts."""
    seg64, seg32 = seg.view(np.uint64), seg.view(np.uint32)
    hdr = seg64[rel >> 3]
    rtype = (hdr & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    rsize = (hdr >> np.uint64(48)).astype(np.int64)
    for i in np.flatnonzero(rtype == LOST).tolist():
        out.lost.append((tail + int(rel[i] + rsize[i]), int(seg64[(rel[i] >> 3) + 2])))
    pick = np.flatnonzero(rtype == SAMPLE)
    rel, rsize = rel[pick], rsize[pick]
    lead = out.lead
    if not np.all(rsize >= RAW + lead + META_SIZE):
        out.simple = False
        return
    fast = seg32[(rel + (lead + _FAST)) >> 2].astype(np.int64)
    out.simple = bool(np.all((fast > 0) & (RAW + lead + META_SIZE + fast <= rsize)))
    ts = (rel + (lead + _TS)) >> 2
    out.ts = seg32[ts].astype(U64) | (seg32[ts + 1].astype(U64) << U64(32))
    out.rel, out.fast = rel, fast
    out.ends = rel + rsize + tail


def merge(got: list, ks: list, limit: int, last: int, blocks: Blocks | None = None) -> Plan:
    """The CPUs' records in time order, the first ks[j] of got[j]'s, laid out straight into one buffer, each copied
    once: pcap's from their rings (sized by pcap()), pcapng's Enhanced Packet Blocks as epb() makes them (planned by
    planned_epb(), from `blocks`). The plan's takes, one per ring."""
    live = [(g, k) for g, k in zip(got, ks) if k]
    if not live:
        return Plan([0] * len(got))
    ts = np.concatenate([g.ts[:k] for g, k in live]) if len(live) > 1 else live[0][0].ts[:live[0][1]]
    p, order = ordered(ts, np.array([k for _g, k in live], np.int64), limit, last)
    takes = iter(p.takes)
    p.takes = [next(takes) if k else 0 for k in ks]
    if not len(order):
        return p
    size = np.concatenate([g.size[:k] for g, k in live]).astype(np.int64)[order]
    where = np.full(len(ts), -1, np.int64)   # each record's place in the buffer (-1: not taken, past -c's limit)
    p.starts = where[order] = np.cumsum(size) - size
    out = np.empty(int(size.sum()), np.uint8)
    first = 0
    for g, k in live:
        at = where[first:first + k]
        first += k
        rows = None if len(order) == len(ts) and k == len(g) else np.flatnonzero(at >= 0)
        if rows is not None:
            at = at[rows]
        if blocks is None:
            _scatter(out, at, g.seg, _rows(g.at, rows).astype(np.int64), _rows(g.size, rows).astype(np.int64))
        else:
            _lay_epb(g, blocks, out, at, rows)
    p.data = memoryview(out)
    return p


def _rows(a, rows):
    return a if rows is None else a[rows]


def pcap(g: RingRecords, head: int = PCAP_REC) -> None:
    """The samples' pcap records: in place, from the header the program laid out (head: where they start in META;
    0: the records with their whole META, fcap.live.drain.WITH_META)."""
    g.out = g.seg
    g.at = (g.rel + (RAW + g.lead + head)).astype(U64)
    g.size = (g.fast + (META_SIZE - head)).astype(U64)


def epb(g: RingRecords, blocks: Blocks, make: Callable) -> bool:
    """The samples' Enhanced Packet Blocks, laid out in a buffer of their own (planned_epb()'s, then _lay_epb()'s);
    False where planned_epb() found none."""
    if not planned_epb(g, blocks, make):
        return False
    if not len(g):
        return True
    size = g.size.astype(np.int64)
    at = np.cumsum(size) - size
    g.out = np.empty(int(size.sum()), np.uint8)
    _lay_epb(g, blocks, g.out, at, None)
    g.at = at.astype(U64)
    return True


def planned_epb(g: RingRecords, blocks: Blocks, make: Callable) -> bool:
    """The samples' Enhanced Packet Blocks planned, not laid out: each one's entry in `blocks` (`make(key, meta)`
    gives the parts of a key it lacks: (first 8 bytes, options before the id, after it)), the length of its header
    after the first 8 bytes with the packet's bytes (`body`), its size. False (nothing planned) where two keys
    share a hash: left to the per-record walk. Each block: the first 8 bytes and the options around the packet id
    from `blocks`, the header after the first 8 bytes and the packet's bytes from the sample, the packet id from its
    metadata (_lay_epb)."""
    if not len(g):
        return True
    seg, rel, lead = g.seg, g.rel, g.lead
    keys = items(seg, _KEY_LEN)[rel + (lead + _KEY_AT)].view(U64).reshape(len(rel), -1)
    if lead:
        keys = np.hstack((items(seg, lead)[rel + RAW].view(U64).reshape(len(rel), -1), keys))
    entry = blocks.entries(keys, lambda i, key: make(key, seg[rel[i] + RAW:rel[i] + RAW + lead + META_SIZE]))
    if entry is None:
        return False
    g.entry, g.body = entry, g.fast + (META_SIZE - META.off("iface"))
    g.size = (8 + g.body + blocks.tail[entry]).astype(U64)
    return True


def _lay_epb(g: RingRecords, blocks: Blocks, out, at, rows) -> None:
    """The blocks planned by planned_epb() (those at `rows`, or all) laid out in `out`, each at its `at`."""
    rel, entry, body = g.rel, g.entry, g.body
    if rows is not None:
        rel, entry, body = rel[rows], entry[rows], body[rows]
    seg, lead = g.seg, g.lead
    off, tail = blocks.off[entry], blocks.tail[entry]
    items(out, 8)[at] = items(blocks.buf, 8)[off]
    _scatter(out, at + 8, seg, rel + (lead + _IFACE), body)
    _scatter(out, at + 8 + body, blocks.buf, off + 8, tail)
    items(out, 8)[at + 8 + body + blocks.mark[entry]] = items(seg, 8)[rel + (lead + _ID)]


class Blocks:
    """pcapng's block parts per metadata key, as arrays: per entry its key and its hash, where its parts lie in
    `buf` (the first 8 bytes, then the options with the packet id's 8 bytes), how long the part after the first 8
    bytes is and where the id lies in it."""

    def __init__(self, lead: int = 0):
        self.lead = lead
        self.hash = self.hashes = np.empty(0, U64)   # each entry's, and all of them sorted (by_hash: whose)
        self.by_hash = np.empty(0, np.int64)
        self.keys = np.empty((0, (lead + _KEY_LEN) // 8), U64)
        self.buf = np.empty(0, np.uint8)
        self.off = self.tail = self.mark = np.empty(0, np.int64)

    def trim(self) -> None:
        """Forget every entry once the cache holds its most (called between passes: a pass's planned blocks keep
        their entries until they are laid out)."""
        if len(self.hashes) >= BLOCK_CACHE_MAX or len(self.buf) + self.keys.nbytes >= BLOCK_CACHE_BYTES:
            self.__init__(self.lead)

    def entries(self, keys, parts: Callable):
        """Each row's entry (`parts(i, key bytes)` makes those of a key not seen yet), or None where two keys
        share a hash."""
        h = _hash(keys)
        pos = np.searchsorted(self.hashes, h)
        hit = pos < len(self.hashes)
        hit[hit] = self.hashes[pos[hit]] == h[hit]
        if not hit.all():
            self._add(keys, h, np.flatnonzero(~hit), parts)
            pos = np.searchsorted(self.hashes, h)
        entry = self.by_hash[pos]
        return entry if (keys == self.keys[entry]).all() else None

    def _add(self, keys, h, rows, parts: Callable) -> None:
        by = np.argsort(h[rows], kind="stable")   # (the first row of each hash, no numpy.unique: see lengths_of)
        hs = h[rows][by]
        rows = rows[by[np.flatnonzero(np.concatenate(([True], hs[1:] != hs[:-1])))]]
        made = [parts(i, keys[i].tobytes()) for i in rows.tolist()]
        blobs = [head8 + before + bytes(8) + after for head8, before, after in made]   # (the id's place)
        lengths = np.array([len(b) for b in blobs], np.int64)
        self.off = np.concatenate((self.off, len(self.buf) + np.cumsum(lengths) - lengths))
        self.tail = np.concatenate((self.tail, lengths - 8))
        self.mark = np.concatenate((self.mark, [len(before) for _h8, before, _a in made]))
        self.buf = np.concatenate((self.buf, np.frombuffer(b"".join(blobs), np.uint8)))
        self.keys = np.concatenate((self.keys, keys[rows]))
        self.hash = np.concatenate((self.hash, h[rows]))
        self.by_hash = np.argsort(self.hash, kind="stable")
        self.hashes = self.hash[self.by_hash]


def _hash(keys):
    """A 64-bit hash of each row (FNV-like, a column at a time: numpy reduces short rows slowly)."""
    h = keys[:, 0] * _MUL
    for j in range(1, keys.shape[1]):
        h ^= keys[:, j]
        h *= _MUL
    return h


def _scatter(dst, dst_at, src, src_at, lengths) -> None:
    """Copies lengths[i] bytes from src at src_at[i] to dst at dst_at[i]: one copy per distinct length."""
    for length in lengths_of(lengths).tolist():
        pick = np.flatnonzero(lengths == length)
        items(dst, length)[dst_at[pick]] = items(src, length)[src_at[pick]]


_NONE = np.empty(0, np.int64)
