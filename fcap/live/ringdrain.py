"""The file rings' drain: RingDrain writes the finished records the capture programs laid out in their per-CPU
rings (fcap.kernel.ringrec) as they are, in the order one sort of their index gives (fcap.live.fastmerge), with
the records of packets with bytes in page frags merged in by time where the kernel has no skb dynptrs (they come
through the perf buffer: fcap.live.drain.FileDrain walks them)."""

from __future__ import annotations

import struct

from bpf.perfbuf import PerfBuffer

from fcap.kernel import layout
from fcap.kernel.layout import RING
from fcap.kernel.ringrec import index_at, index_entries
from fcap.live import order
from fcap.live.drain import EPB_PARTS, FAST, FileDrain, Walk, before_cutoff, write_plan


class RingDrain:
    """Drains the per-CPU file rings (see fcap.kernel.ringrec) into a writer in time order: the programs wrote finished
    pcap/pcapng records there and an index entry per record (its timestamp and end), so the CPUs' records are
    merged without a look at any record: by one numpy sort of the index (fcap.live.fastmerge: the records copied
    into one buffer, or written as (address, length) pairs), or where numpy is missing (or `fast` is False) by runs
    (fcap.live.order, written as byte ranges). Records past the cutoff stay in their ring (tail stops before them)
    until a later pass. `limit` (> 0) stops it after that many, the oldest (fcap.live.order.reached). The perf
    buffer only carries doorbells. `side`: where the kernel has no skb dynptrs, the drain of the perf buffer that
    carries the records of packets with bytes in page frags (fcap.kernel.ringrec.frags_by_perf), and with --context
    those whose names user space has not given the programs yet (ringrec.names_context), merged in by time."""

    def __init__(self, ring_map, ring_size: int, buffer: PerfBuffer, writer, limit: int = 0,
                 window: order.Window | None = None, fast: bool = True, side: FileDrain | None = None):
        self.map = ring_map
        self.mm = ring_map.mmap()
        self.view = memoryview(self.mm)
        self.words = self.view.cast("Q")   # control words: stored with one 8-byte store each (never pack_into,
        self.buffer = buffer                # which zeroes the bytes before it writes them)
        self.writer = writer
        self.size = ring_size
        self.entries = index_entries(ring_size)
        self.bases = [i * ring_map.stride for i in range(ring_map.max_entries)]   # (multiples of 8)
        self.index = [(b + index_at(ring_size)) // 8 for b in self.bases]
        self.counts = [0] * len(self.bases)   # records taken (as `taken`)
        self.taken = 0                         # ... all CPUs' together: those written and those -c passed over
        self.tails = [0] * len(self.bases)
        self.disorder = [0] * len(self.bases)   # each CPU's count of records out of order, as last read
        self.ordered = [True] * len(self.bases)   # its records not taken yet are in time order
        self.moved = [False] * len(self.bases)    # its count moved in this pass
        self.left = limit
        self.window = window or order.Window()
        self.written = 0
        self.held = False      # records were left in a ring a quarter full or more, its doorbell not cleared
        self.reached = False   # -c within reach: detach, then the last pass (fcap.live.order.reached)
        self.side = side
        self.fast = fast and (len(self.bases) > 1 or side is not None)   # merge through fcap.live.fastmerge
        self.address: int | None = None   # of the mapping, and numpy's views of it (fastmerge's)
        self.np_words = self.np_bytes = None
        if self.fast:   # (before `listening on`: a flood that starts at once is merged at C speed from its start)
            FAST.wait()

    @property
    def done(self) -> bool:
        return self.left > 0 and self.written >= self.left

    def __call__(self, final: bool = False) -> int:
        """One pass: write what is surely published (everything when `final`: the programs are detached)."""
        self.buffer.drain(_ignore)
        cutoff = self.window.cutoff(final)
        spans, pressed = self._spans()
        fast = FAST.module if self.fast else None
        side = self._side(fast)
        new = sum(new for _at, new in spans) + sum(map(len, side))
        if not final and order.reached(new, self.left - self.written if self.left else 0):
            self.reached = True
            _clear(side)
            return 0
        if pressed or side and self.side.pressed(side):
            cutoff = self.window.pressed(cutoff)
        # (records on one CPU only are one run: written as one range, nothing to sort)
        walked = bool(side) and isinstance(side[0], Walk)
        if fast is not None and not walked and (sum(1 for _at, new in spans if new) > 1 or any(map(len, side))):
            n = self._fast(fast, spans, cutoff, side)
        else:
            n = self._by_runs(spans, cutoff, side)
        self.written += n
        return n

    def _side(self, fast) -> list:
        """The side perf buffer's pending records (none without one): as arrays where numpy lays them all out, else
        walked one by one."""
        if self.side is None or not self.side.pending():
            return []   # (most passes: the side buffer takes only the records the rings cannot)
        got = self.side.arrays() if fast is not None else None
        return got if got is not None else self.side.walks()

    def _spans(self) -> tuple[list, bool]:
        """Per CPU: where its records published and not taken yet start in the words (of its index), and how many;
        self.ordered says which are in time order. And whether a ring is a quarter full or more."""
        words, mask = self.words, self.entries - 1
        spans = []
        pressed = False
        for i, base in enumerate(self.bases):
            head = words[(base + _HEAD) // 8]
            pressed = pressed or ((head - self.tails[i]) & layout.HEAD_POS) >= self.size // 4
            disorder = words[(base + _DISORDER) // 8]   # (read after head: it counts every record head does, and
            self.moved[i] = disorder != self.disorder[i]   # maybe one head does not show yet)
            if self.moved[i]:
                self.disorder[i] = disorder
                self.ordered[i] = False
            new = ((head >> layout.HEAD_BITS) - self.counts[i]) & layout.HEAD_COUNT
            spans.append((self.index[i] + 2 * (self.counts[i] & mask), new))
        return spans, pressed

    def _fast(self, fast, spans: list, cutoff: int, side: list) -> int:
        """The pass through fcap.live.fastmerge: one sort of every record's timestamp, the records copied in that
        order into one buffer, or written as (address, length) pairs. `side`: the side perf buffer's records, laid
        out as arrays (perfwalk's), merged in."""
        if self.address is None:
            self.address = _address(self.mm)
            self.np_words = fast.words(self.address, len(self.mm) // 8)
            self.np_bytes = self.np_words.view(fast.np.uint8)
        entries, firsts, rings = [], [], []
        for i, (at, new) in enumerate(spans):
            if new:
                e = self._entries(fast, i, at, new).reshape(-1, 2)
                entries.append(e[:fast.eligible(e[:, 0], cutoff, self.ordered[i])])
            else:
                entries.append(fast.NONE)
            firsts.append(self.tails[i])
            rings.append(self.bases[i] + RING.size)
        left = self.left - self.written if self.left else -1
        if any(len(g) for g in side):
            p = fast.plan_with(entries, firsts, rings, self.size, self.np_bytes, side,
                               before_cutoff(fast, side, cutoff), left, self.window.last)
        else:
            p = fast.plan(entries, firsts, rings, self.size, left, self.window.last, self.np_bytes)
        write_plan(self.writer, self.window, p)
        ends = [e[:, 1] for e in entries]
        n = len(self.bases)
        self._advance(p.takes[:n], ends, [new for _at, new in spans])
        if side:
            self.side.release(side, p.takes[n:] or [0] * len(side))
        return p.count

    def _entries(self, fast, i: int, at: int, new: int):
        """CPU i's `new` index entries from word `at`, flat: a view, or a copy where they wrap around its end."""
        w, end, limit = self.np_words, at + 2 * new, self.index[i] + 2 * self.entries
        if end <= limit:
            return w[at:end]
        return fast.np.concatenate((w[at:limit], w[self.index[i]:self.index[i] + end - limit]))

    def _by_runs(self, spans: list, cutoff: int, side: list) -> int:
        """The pass through fcap.live.order: runs of each CPU's records, merged in Python (where numpy is not
        installed). `side`: the side perf buffer's records (walked, or as arrays), each ring a source of its own."""
        batches, ends = self._new(spans)
        n = len(batches)
        try:
            runs, takes = order.merge(self.window, batches + [_list(g.ts) for g in side],
                                      self.ordered + [order.is_sorted(_list(g.ts)) for g in side], cutoff,
                                      self.left - self.written if self.left else -1)
            self._write(runs, ends, side)
            self._advance(takes[:n], ends, [len(b) for b in batches])
            if side:
                self.side.release(side, takes[n:])
            return order.count(runs)
        finally:
            _clear(side)
            for v in batches + ends:
                if isinstance(v, memoryview):
                    v.release()

    def _new(self, spans: list) -> tuple[list, list]:
        """Per CPU: the timestamps and end positions of its records in `spans`, as strided views of its index
        (lists where they wrap around its end)."""
        words = self.words
        batches, ends = [], []
        for i, (at, new) in enumerate(spans):
            end, limit = at + 2 * new, self.index[i] + 2 * self.entries
            if not new:
                batches.append(_EMPTY)
                ends.append(_EMPTY)
            elif end <= limit:
                batches.append(words[at:end:2])
                ends.append(words[at + 1:end:2])
            else:
                flat = words[at:limit].tolist() + words[self.index[i]:self.index[i] + end - limit].tolist()
                batches.append(flat[0::2])
                ends.append(flat[1::2])
        return batches, ends

    def _write(self, runs: list, ends: list, side: list) -> None:
        if not runs:
            return
        view, size, hmask = self.view, self.size, layout.HEAD_POS
        parts = []
        n = len(self.bases)
        for i, a, b in runs:
            if i >= n:   # (the side perf buffer's)
                parts += _side_parts(side[i - n], a, b, self.side.pcapng)
                continue
            pos = ends[i][a - 1] if a else self.tails[i]
            length = (ends[i][b - 1] - pos) & hmask
            start = self.bases[i] + RING.size
            t = pos & (size - 1)
            first = min(length, size - t)
            parts.append(view[start + t:start + t + first])
            if length > first:
                parts.append(view[start:start + length - first])
        try:
            self.writer.writev(parts)
        finally:
            for p in parts:
                if isinstance(p, memoryview):
                    p.release()

    def _advance(self, takes: list, ends: list, lengths: list) -> None:
        """Give the bytes and index entries of the records taken back to the programs. `lengths`: how many records
        of each CPU the pass looked at."""
        words, size = self.words, self.size
        self.held = False
        for i, base in enumerate(self.bases):
            k = takes[i]
            if k:
                self.tails[i] = int(ends[i][k - 1])
                words[(base + _TAIL) // 8] = self.tails[i]
                self.counts[i] = (self.counts[i] + k) & layout.HEAD_COUNT
                words[(base + _TAKEN) // 8] = self.counts[i]
                self.taken += k
            if k == lengths[i] and not self.moved[i]:
                self.ordered[i] = True   # (until the program counts a record out of order again)
            # the doorbell cleared once tail is stored (cleared before, every record published while the bytes were
            # being written saw the old tail and rang again), and only when less than a quarter of the ring is
            # still in use: held records would ring again at once (a wake-up per record); the loop drains again at
            # once then (held), the ring filling up (the pass's margin is shorter: fcap.live.order.Window.pressed)
            bell = (base + _BELL) // 8
            if words[bell]:
                if ((words[(base + _HEAD) // 8] - self.tails[i]) & layout.HEAD_POS) < size // 4:
                    words[bell] = 0
                else:
                    self.held = True

    def published(self) -> int:
        """Records the programs have published so far: those taken (written, or past -c) plus those not yet."""
        if self.view is None:
            return self.taken
        left = 0
        for i, base in enumerate(self.bases):
            head = _U64.unpack_from(self.view, base + _HEAD)[0]
            left += ((head >> layout.HEAD_BITS) - self.counts[i]) & layout.HEAD_COUNT
        return self.taken + left

    def close(self) -> None:
        self.np_words = self.np_bytes = None
        if self.view is not None:
            self.words.release()
            self.view.release()
            self.view = None
            self.mm.close()


def _side_parts(g, a: int, b: int, pcapng: bool) -> list:
    """Records a to b of a side ring's: a walk's parts, or laid-out arrays' bytes (perfwalk's out, at, size)."""
    if isinstance(g, Walk):
        per = EPB_PARTS if pcapng else 1
        return g.parts[a * per:b * per]
    out = g.out
    return [out[int(at):int(at) + int(n)].tobytes() for at, n in zip(g.at[a:b], g.size[a:b])]


def _list(ts) -> list:
    return ts if isinstance(ts, list) else ts.tolist()


def _clear(side: list) -> None:
    """The walks' parts let go (they hold views of the rings, which must close)."""
    for g in side:
        if isinstance(g, Walk):
            g.parts.clear()


def _address(mm) -> int:
    """Where a mapping lies in memory (the export ctypes takes to learn it is let go at once)."""
    import ctypes
    ref = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(ref)
    finally:
        del ref


_HEAD, _TAIL, _TAKEN, _BELL = RING.off("head"), RING.off("tail"), RING.off("taken"), RING.off("bell")
_DISORDER = RING.off("disorder")
_EMPTY: list = []
_U64 = struct.Struct("=Q")


def ring_records(ring_map) -> int:
    """Records published in a file rings' map so far (the count bits of each CPU's head), for a session whose rings
    no RingDrain read."""
    mm = ring_map.mmap()
    try:
        return sum(_U64.unpack_from(mm, i * ring_map.stride + RING.off("head"))[0] >> layout.HEAD_BITS
                   for i in range(ring_map.max_entries))
    finally:
        mm.close()


def _ignore(cpu: int, raw) -> None:
    pass
