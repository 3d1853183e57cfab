"""The ordering rule every drain keeps: records reach the output in time order, and `-c N` keeps the first N by
time. Each CPU's records come in time order (nearly: see below); a drain merges the CPUs' batches by timestamp.
A record is merged only once it is surely published: its timestamp (bpf_ktime_get_ns, CLOCK_MONOTONIC, as
time.monotonic_ns) lies before the cutoff, the time the drain pass began less a margin; later ones are held until a
later pass. A program publishes its record within microseconds of reading the time, so a margin of a few ms
covers it; a record that still arrives after newer ones were written (a program interrupted for longer) is written
anyway, counted as late, and the margin grows; while a ring is filling up the margin is shorter (held bytes
would crowd out new records). When the capture ends (the programs detached) everything is flushed. A program
interrupted by another point's program on the same CPU can publish an older record after a newer one: such a
CPU's batch is unsorted and is merged record by record.

`-c N` keeps the N oldest: once the records published and not yet written would complete it (reached()), a pass
writes none of them; the capture detaches its programs and its last pass writes the oldest of all they published.
(Written at once, a record whose program was held between its clock read and its publish for longer than the
margin would be passed over for a newer one.)"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right

MARGIN_NS = 2_000_000         # the margin to begin with
MARGIN_MAX_NS = 1_000_000_000
FINAL = 1 << 64               # the cutoff of the last pass: everything
PRESSED = 16                  # a ring filling up: the margin this many times shorter (Window.pressed)


class Window:
    """The cutoff of each drain pass, with a margin that grows when records come late; also what was written
    last (late records are those older than it)."""

    __slots__ = ("margin", "last", "late", "lag")

    def __init__(self, margin_ns: int = MARGIN_NS):
        self.margin = margin_ns
        self.last = 0         # the newest timestamp written so far
        self.late = 0         # records written after a newer one (out of time order) ...
        self.lag = 0          # ... and by how much, at most (ns older than the newest written before them)

    def cutoff(self, final: bool = False) -> int:
        """Records before this may be merged now: read it before reading the buffers' heads."""
        return FINAL if final else time.monotonic_ns() - self.margin

    def pressed(self, cutoff: int) -> int:
        """The cutoff of a pass that found a ring a quarter full or more: records held for the whole margin would
        crowd out new ones (at GB/s, 2 ms of loopback TCP fills a 2 MiB ring), so the margin is PRESSED times
        shorter (still far longer than a program takes to publish on a host)."""
        return cutoff if cutoff == FINAL else cutoff + self.margin - self.margin // PRESSED

    @property
    def retry_ms(self) -> int:
        """How soon to look again while records are held (the per-record path)."""
        return max(1, self.margin // 1_000_000)

    def wrote(self, late: int, newest: int, oldest: int = 0) -> None:
        """A pass wrote records from `oldest` up to `newest`, `late` of them older than what an earlier pass
        wrote."""
        if late:
            self.late += late
            self.lag = max(self.lag, self.last - oldest)
            self.margin = min(self.margin * 2, MARGIN_MAX_NS)
        if newest > self.last:
            self.last = newest

    def disorder(self) -> str:
        """What the output says of the records written out of time order ("" when none was)."""
        if not self.late:
            return ""
        return (f"{self.late} packet{'s' if self.late != 1 else ''} written out of time order (late), up to "
                f"{self.lag / 1000:.0f} us")


def reached(at_hand: int, left: int) -> bool:
    """Whether `at_hand` records (published, not yet written) would complete -c, `left` (> 0) records short; 0:
    no -c."""
    return 0 < left <= at_hand


def is_sorted(ts) -> bool:
    return all(a <= b for a, b in zip(ts, ts[1:])) if len(ts) < 8 else list(ts) == sorted(ts)


def eligible(ts, cutoff: int, ordered: bool) -> int:
    """How many of a batch's records (from its start) may be merged: those before the first at or past the
    cutoff. A batch is a sequence of timestamps (a list, or a strided memoryview of a ring's index)."""
    if ordered:
        return bisect_left(ts, cutoff)
    for i, t in enumerate(ts):
        if t >= cutoff:
            return i
    return len(ts)


def late_count(batches: list, takes: list, ordered: list, last: int) -> int:
    """Records about to be written that are older than the newest one written before."""
    n = 0
    for ts, k, o in zip(batches, takes, ordered):
        if k:
            n += bisect_left(ts, last, 0, k) if o else sum(1 for t in ts[:k] if t < last)
    return n


def runs(batches: list, takes: list, ordered: list, limit: int = -1) -> list:
    """The merge of the first takes[i] records of each batch in time order, at most `limit` records (-1: all), as
    runs (batch, first, end): consecutive records of one batch written together. Batches in time order
    (ordered[i]) merge by runs, a bisect per run; when one is not, record by record."""
    live = [i for i, k in enumerate(takes) if k]
    if not live:
        return []
    if len(live) == 1 and ordered[live[0]]:
        i = live[0]
        k = takes[i] if limit < 0 else min(takes[i], limit)
        return [(i, 0, k)] if k else []
    if not all(ordered[i] for i in live):
        return _by_record(batches, takes, limit)
    pos = [0] * len(batches)
    out = []
    left = limit
    while left:
        live = [i for i in live if pos[i] < takes[i]]
        if not live:
            break
        if len(live) == 1:
            i = live[0]
            end = takes[i] if left < 0 else min(takes[i], pos[i] + left)
        else:
            i = min(live, key=lambda j: batches[j][pos[j]])
            bound = min(batches[j][pos[j]] for j in live if j != i)
            end = bisect_right(batches[i], bound, pos[i], takes[i])
            if left >= 0:
                end = min(end, pos[i] + left)
        out.append((i, pos[i], end))
        if left > 0:
            left -= end - pos[i]
        pos[i] = end
    return out


def _by_record(batches: list, takes: list, limit: int) -> list:
    order = sorted((ts[j], i, j) for i, ts in enumerate(batches) for j in range(takes[i]))
    if limit >= 0:
        order = order[:limit]
    out: list = []
    for _t, i, j in order:
        if out and out[-1][0] == i and out[-1][2] == j:
            out[-1] = (i, out[-1][1], j + 1)
        else:
            out.append((i, j, j + 1))
    return out


def count(runs_: list) -> int:
    """How many records the runs write (fewer than taken() covers where -c's limit cut through a batch out of
    order: those passed over are past the limit)."""
    return sum(b - a for _i, a, b in runs_)


def taken(runs_: list, n: int) -> list:
    """Per batch, how many records from its start the runs cover (all of them must go before the ring's tail may
    pass them: a batch's records are taken as a prefix)."""
    out = [0] * n
    for i, _first, end in runs_:
        if end > out[i]:
            out[i] = end
    return out


def newest(batches: list, runs_: list, ordered: list) -> int:
    return max((batches[i][b - 1] if ordered[i] else max(batches[i][a:b]) for i, a, b in runs_), default=0)


def merge(window: Window, batches: list, ordered: list, cutoff: int, limit: int = -1) -> tuple[list, list]:
    """One pass of a drain: the runs to write, in time order, and per batch how many records they take; the
    window learns what was written (and what came late)."""
    takes = [eligible(ts, cutoff, o) for ts, o in zip(batches, ordered)]
    out = runs(batches, takes, ordered, limit)
    takes = taken(out, len(batches))
    if out:
        late = late_count(batches, takes, ordered, window.last)
        oldest = min(min(batches[i][a:b]) for i, a, b in out) if late else 0
        window.wrote(late, newest(batches, out, ordered), oldest)
    return out, takes


class Pending:
    """The per-record path's hold (Session.run, the API): records (with .ts_ns) kept in user space between
    passes; take() returns the ones to deliver now, in time order."""

    def __init__(self, window: Window | None = None):
        self.window = window or Window()
        self.held: list = []
        self.reached = False   # -c is within reach: detach, then take(final)

    def take(self, batch: list, cutoff: int, left: int = 0) -> list:
        """`left` (> 0): -c's records still to deliver (see reached())."""
        recs = self.held + batch if self.held else batch
        recs.sort(key=_ts)
        if cutoff != FINAL and reached(len(recs), left):
            self.held, self.reached = recs, True
            return []
        k = bisect_left([r.ts_ns for r in recs], cutoff) if cutoff != FINAL else len(recs)
        if left > 0:
            k = min(k, left)
        out, self.held = recs[:k], recs[k:]
        if out:
            w = self.window
            late = sum(1 for r in out if r.ts_ns < w.last) if out[0].ts_ns < w.last else 0
            w.wrote(late, out[-1].ts_ns, out[0].ts_ns)
        return out


def _ts(rec) -> int:
    return rec.ts_ns
