"""The file rings' merge at C speed (numpy): the CPUs' index entries (timestamp, end) sorted by time in one stable
argsort, and the records to write as (address, length) pairs in that order (fcap.files.iovec writes them), so that
no Python runs per record however finely the CPUs' records interleave. The same rule as fcap.live.order: records
before the cutoff, each CPU's taken as a prefix, `-c` the first by time. Imported when a drain first needs it
(numpy's import costs ~90 ms: never on a capture's way to `listening on`)."""

from __future__ import annotations

import ctypes

import numpy as np

from fcap.kernel import layout

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


class Plan:
    """One pass's merge: `iov` the records to write, in time order; `takes[j]` how many of CPU j's records (of those
    given) they cover; `late` how many are older than `last`; `newest` and `oldest` their timestamps' range."""

    __slots__ = ("iov", "takes", "late", "newest", "oldest")

    def __init__(self, iov, takes: list, late: int = 0, newest: int = 0, oldest: int = 0):
        self.iov, self.takes, self.late, self.newest, self.oldest = iov, takes, late, newest, oldest


def plan(entries: list, firsts: list, addresses: list, ring_size: int, limit: int, last: int) -> Plan:
    """The merge of CPUs' records: per CPU its eligible index entries ((k, 2) arrays of timestamp and end),
    where its first record starts (its tail, position bits) and the address of its ring's byte 0. `limit` >= 0
    keeps only the first `limit` by time."""
    ks = np.fromiter((len(e) for e in entries), dtype=np.int64, count=len(entries))
    n = int(ks.sum())
    if not n:
        return Plan(NONE, [0] * len(entries))
    live = [e for e in entries if len(e)]
    flat = np.concatenate(live) if len(live) > 1 else live[0]
    ts, end = flat[:, 0], flat[:, 1]
    offsets = np.cumsum(ks) - ks                  # where each CPU's records start in `flat`
    has = ks > 0
    start = np.empty(n, U64)
    start[1:] = end[:-1]
    start[offsets[has]] = np.array(firsts, U64)[has]
    size = (end - start) & U64(layout.HEAD_POS)
    addr = np.repeat(np.array(addresses, U64), ks) + (start & U64(ring_size - 1))
    order = np.argsort(ts, kind="stable")         # each CPU's records keep their order among equal times
    takes = ks.tolist()
    if 0 <= limit < n:
        order = order[:limit]
        cpu = np.repeat(np.arange(len(entries)), ks)[order]
        upto = np.zeros(len(entries), np.int64)
        np.maximum.at(upto, cpu, order - offsets[cpu] + 1)   # a CPU's records go as a prefix
        takes = upto.tolist()
    iov = np.empty((len(order), 2), U64)
    iov[:, 0] = addr[order]
    iov[:, 1] = size[order]
    chosen = ts[order]
    if not len(chosen):
        return Plan(iov, takes)
    late = int(np.count_nonzero(chosen < U64(last))) if last else 0
    return Plan(iov, takes, late, int(chosen[-1]), int(chosen[0]))
