"""The file rings' merge at C speed (numpy): the CPUs' index entries (timestamp, end) sorted by time in one stable
argsort, and the records to write as (address, length) pairs in that order (fcap.files.iovec writes them), so that
no Python runs per record however finely the CPUs' records interleave. The same rule as fcap.live.order: records
before the cutoff, each CPU's taken as a prefix, `-c` the first by time. Imported when a drain first needs it
(numpy's import costs ~90 ms: never on a capture's way to `listening on`)."""

from __future__ import annotations

import ctypes
import os

from fcap.kernel import layout


def _import_numpy():
    """numpy with its BLAS on one thread: the merge calls no BLAS, and OpenBLAS would start a thread per CPU at
    import (~100 ms of CPU on 2 CPUs, more the more CPUs). The environment is left as it was (the command fcap runs
    inherits it)."""
    set_here = "OPENBLAS_NUM_THREADS" not in os.environ
    if set_here:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy
        import numpy.ctypeslib   # noqa: F401 (words()'; numpy imports it at its first use: ~6-14 ms of a first pass)
    finally:
        if set_here:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
    return numpy


np = _import_numpy()

U64 = np.uint64
NONE = np.empty((0, 2), U64)   # a CPU's entries when it has none


def words(address: int, count: int):
    """A uint64 array over memory the caller keeps mapped (no buffer export: the mapping may close while a view of
    it lingers in a traceback; the caller never reads one after)."""
    return np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(address))


def eligible(ts, cutoff: int, ordered: bool) -> int:
    """How many of a CPU's records, from its first, lie before the cutoff (fcap.live.order.eligible)."""
    if ordered:
        return int(np.searchsorted(ts, U64(min(cutoff, (1 << 64) - 1)), "left"))
    past = np.flatnonzero(ts >= U64(min(cutoff, (1 << 64) - 1)))
    return int(past[0]) if len(past) else len(ts)


GATHER_LENGTHS = 8   # a pass whose records come in at most this many lengths is copied into one buffer (two
                     # copies a record at C speed beat a writev pair each: the kernel's cost per pair is ~75 ns)


class Plan:
    """One pass's merge: the records to write in time order, as one buffer (`data`, a memoryview) or, where it
    would take too many copies to make, as `iov`, (address, length) pairs; `takes[j]` how many of CPU j's records
    (of those given) they cover, `count` how many they are (fewer where -c's limit cuts through a CPU's records out
    of order); `late` how many are older than `last`; `newest` and `oldest` their timestamps'
    range; `starts`, where each record starts in `data` (where the merge knows: fcap.live.perfwalk's)."""

    __slots__ = ("data", "iov", "memory", "takes", "count", "late", "newest", "oldest", "starts")

    def __init__(self, takes: list, count: int = 0, late: int = 0, newest: int = 0, oldest: int = 0):
        self.data = self.iov = self.memory = self.starts = None   # (memory: what iov points into, kept until the
        # plan goes)
        self.takes, self.count = takes, count
        self.late, self.newest, self.oldest = late, newest, oldest


def plan(entries: list, firsts: list, rings: list, ring_size: int, limit: int, last: int, memory) -> Plan:
    """The merge of CPUs' records: per CPU its eligible index entries ((k, 2) arrays of timestamp and end),
    where its first record starts (its tail, position bits) and where its ring's byte 0 lies in `memory` (the
    mapping, bytes). `limit` >= 0 keeps only the first `limit` by time."""
    ts, at, size, ks = _ring_arrays(entries, firsts, rings, ring_size)
    if not len(ts):
        return Plan([0] * len(entries))
    return chosen(ts, at, size, ks, limit, last, memory)


def plan_with(entries: list, firsts: list, rings: list, ring_size: int, memory, side: list, side_ks: list,
              limit: int, last: int) -> Plan:
    """plan()'s merge with the first side_ks[j] records of each of `side`, perf rings' records laid out elsewhere
    (fcap.live.perfwalk's RingRecords: timestamps, and where each file record lies in its `out` and its length);
    the plan's takes: the CPUs' rings', then the side's."""
    ts, at, size, ks = _ring_arrays(entries, firsts, rings, ring_size)
    memories = [memory] + [g.out if g.out is not None else memory for g in side]
    src = [np.zeros(len(ts), np.int64)] + [np.full(k, j + 1, np.int64) for j, k in enumerate(side_ks)]
    ks = np.concatenate((ks, np.array(side_ks, np.int64)))

    def flat(mine, field: str):   # (a ring without records has int64 arrays: kept out, numpy would make floats)
        return np.concatenate([mine] + [getattr(g, field)[:k].astype(U64) for g, k in zip(side, side_ks) if k])
    return chosen(flat(ts, "ts"), flat(at, "at"), flat(size, "size"), ks, limit, last, memories, np.concatenate(src))


def _ring_arrays(entries: list, firsts: list, rings: list, ring_size: int):
    """The rings' records as flat arrays (timestamps, offsets in the mapping, lengths) and each CPU's count."""
    ks = np.fromiter((len(e) for e in entries), dtype=np.int64, count=len(entries))
    n = int(ks.sum())
    if not n:
        return np.empty(0, U64), np.empty(0, U64), np.empty(0, U64), ks
    live = [e for e in entries if len(e)]
    flat = np.concatenate(live) if len(live) > 1 else live[0]
    ts, end = flat[:, 0], flat[:, 1]
    offsets = np.cumsum(ks) - ks                  # where each CPU's records start in `flat`
    has = ks > 0
    start = np.empty(n, U64)
    start[1:] = end[:-1]
    start[offsets[has]] = np.array(firsts, U64)[has]
    size = (end - start) & U64(layout.HEAD_POS)
    at = np.repeat(np.array(rings, U64), ks) + (start & U64(ring_size - 1))
    return ts, at, size, ks


def ordered(ts, ks, limit: int, last: int) -> tuple[Plan, object]:
    """The merge's order of records given CPU after CPU (`ks[j]` each: their timestamps `ts`), and its plan without
    the records: what it takes of each CPU and when the records lie, -c's `limit` (>= 0) applied."""
    offsets = np.cumsum(ks) - ks                  # where each CPU's records start
    n = len(ts)
    order = np.argsort(ts, kind="stable")         # each CPU's records keep their order among equal times
    takes = ks.tolist()
    if 0 <= limit < n:
        order = order[:limit]
        cpu = np.repeat(np.arange(len(ks)), ks)[order]
        upto = np.zeros(len(ks), np.int64)
        np.maximum.at(upto, cpu, order - offsets[cpu] + 1)   # a CPU's records go as a prefix
        takes = upto.tolist()
    if not len(order):
        return Plan(takes), order
    picked = ts[order]
    late = int(np.count_nonzero(picked < U64(last))) if last else 0
    return Plan(takes, len(order), late=late, newest=int(picked[-1]), oldest=int(picked[0])), order


def chosen(ts, at, size, ks, limit: int, last: int, memory, src=None) -> Plan:
    """The merge of records given as flat arrays, each CPU's (`ks[j]` of them) after the one before: timestamps,
    offsets in `memory` and lengths (fcap.live.perfwalk's, or plan's). `memory`: one array, or a list of them and
    per record `src`, the one it lies in (plan_with's)."""
    p, order = ordered(ts, ks, limit, last)
    if not len(order):
        return p
    at, size = at[order], size[order]
    if src is not None:
        _from_many(p, memory, src[order], at, size)
    elif len(at) > 1 and (at[1:] == at[:-1] + size[:-1]).all():   # one stretch of memory already: as it is
        p.data = memoryview(memory[int(at[0]):int(at[-1] + size[-1])])
    else:
        p.data = gathered(memory, at, size)
        if p.data is None:
            p.memory = memory
            p.iov = np.empty((len(order), 2), U64)
            p.iov[:, 0] = at + U64(memory.ctypes.data)
            p.iov[:, 1] = size
    return p


def _from_many(p: Plan, memories: list, src, at, size) -> None:
    """The plan's records, each in memories[src[i]]: copied into one buffer (one gather per memory and length),
    or (too many lengths) as (address, length) pairs."""
    if int(size.min()) == int(size.max()) and bool((src == src[0]).all()):
        p.data = gathered(memories[int(src[0])], at, size)
        return
    lengths = [(j, L) for j in range(len(memories)) for L in lengths_of(size[src == j]).tolist()]
    if len(lengths) > 2 * GATHER_LENGTHS:
        p.memory = memories
        bases = np.array([m.ctypes.data for m in memories], U64)
        p.iov = np.empty((len(at), 2), U64)
        p.iov[:, 0] = at + bases[src]
        p.iov[:, 1] = size
        return
    out = np.empty(int(size.sum()), np.uint8)
    to = (np.cumsum(size) - size).astype(np.intp)
    src_at = at.astype(np.intp)
    for j, length in lengths:
        pick = np.flatnonzero((src == j) & (size == U64(length)))
        items(out, length)[to[pick]] = items(memories[j], length)[src_at[pick]]
    p.data = memoryview(out)


def items(buf, length: int):
    """Every `length`-byte run of buf, one starting at each byte: an item per record start, copied whole."""
    return np.ndarray((len(buf) - length + 1,), dtype=np.dtype((np.void, length)), buffer=buf, strides=(1,))


def lengths_of(size):
    """The distinct lengths among `size`, ascending (counted, not sorted: no numpy.unique, whose first call imports
    numpy.ma, ~7 ms of a drain's first pass)."""
    return np.flatnonzero(np.bincount(size.astype(np.intp)))


def distinct(values) -> tuple:
    """numpy.unique(values, return_index=True, return_inverse=True)[1:] for a 1-d array: the first index of each
    distinct value (in the values' order) and each element's number among them; by an unstable sort, ~4 times
    cheaper than the stable one numpy.unique asks for, and without its first call's import of numpy.ma."""
    order = np.argsort(values)
    ordered = values[order]
    new = np.empty(len(values), bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    inverse = np.empty(len(values), np.intp)
    inverse[order] = np.cumsum(new) - 1
    first = np.minimum.reduceat(order, np.flatnonzero(new)) if len(values) else order
    return first, inverse


def gathered(memory, at, size):
    """The records (`size` bytes at offset `at` of memory, in order) copied into one buffer, one gather (and, when
    their lengths differ, one scatter) per length; None when they come in more than GATHER_LENGTHS lengths."""
    lo, hi = int(size.min()), int(size.max())
    if lo == hi:
        return memoryview(items(memory, lo)[at.astype(np.intp)].view(np.uint8))
    lengths = lengths_of(size)
    if len(lengths) > GATHER_LENGTHS:
        return None
    out = np.empty(int(size.sum()), np.uint8)
    to = np.cumsum(size) - size
    src = at.astype(np.intp)
    for length in lengths.tolist():
        pick = np.flatnonzero(size == U64(length))
        items(out, length)[to[pick].astype(np.intp)] = items(memory, length)[src[pick]]
    return memoryview(out)
