"""Capture records to the file without per-record objects: FileDrain slices perf samples (whose record header the
program laid out) into os.writev batches; RingDrain writes the file rings' finished records (kernel.ringrec) as they
are, in the order one sort of their index gives (fcap.live.fastmerge)."""

from __future__ import annotations

import struct
import threading
from typing import Callable

from bpf.perfbuf import PerfBuffer
from bpf.uapi import PerfRecord

from fcap.kernel import layout

from fcap.live import order
from fcap.kernel.layout import META, META_SIZE, PCAP_REC, RING
from fcap.kernel.ringrec import index_at, index_entries

RAW = 12                        # perf_event_header + the raw sample's u32 size: the sample's bytes start here
SAMPLE, LOST = int(PerfRecord.SAMPLE), int(PerfRecord.LOST)
_LOST = struct.Struct("<16xQ")  # lost, after the perf_event_header and the id
_RAWSIZE = struct.Struct("<8xI")
# one unpack per record: type, size, (pcapng: the metadata that decides the block's options), FAST
_FAST = META.off("fast")
_IFACE = META.off("iface")        # an EPB's header after its type and length (epb_parts makes those 8 bytes)
_TS_END = META.end("ts")
assert META.off("ts") == 0
_PCAP = struct.Struct(f"<I2xH4xQ{_FAST - _TS_END}xI")
# the blocks' options are cached by the metadata they show, from skb to fast (every field user space reads but ts
# and id lies there: fcap.kernel.layout.meta_fields refuses a layout where one does not; --stack's id among them: a
# stack's frames never change, fcap.kernel.kstack); the packet id (before them) is each record's own, written into
# the cached options at ID_MARK's place
_KEY_AT, _KEY_END = META.off("skb"), _FAST
_ID_AT = META.off("id")
ID_MARK = 0xFCA1D0FCA1D0FCA1
_ID_MARK = ID_MARK.to_bytes(8, "little")
_PCAPNG = struct.Struct(f"<I2xH4xQ{_KEY_AT - _TS_END}x{_KEY_END - _KEY_AT}sI")
EPB_PARTS = 5   # writev parts of a pcapng record: its first 8 bytes, header and bytes, options to the id, id, the rest
SPAN = RAW + META.end("fast")     # bytes of a record the unpack reads
CACHE_MAX = 1 << 14

# For a pcapng block: the options of a record (epb_parts' keyword arguments; fcap.features.notes.RecordNotes)
RecordOptions = Callable[[layout.Record], dict]


class FileDrain:
    """Drains a session's perf buffer into a pcap/pcapng writer in time order. Call it to drain once; it returns how
    many records it wrote. Each CPU's records are walked (one unpack each: type, size, timestamp), merged by time
    (fcap.live.order) and written with os.writev; records past the cutoff stay in their ring for a later pass. With
    numpy (`fast`), a pass finds, reads, lays out and merges them as arrays instead (fcap.live.perfwalk).
    `limit` (when > 0) stops it after that many records in all, the oldest (fcap.live.order.reached). pcapng blocks
    get their options from `options(record)`, cached by the metadata they depend on (the record made by `parse`:
    the session's, which names --stack's frames from META's stack id)."""

    def __init__(self, buffer: PerfBuffer, writer, options: RecordOptions | None = None, limit: int = 0,
                 window: order.Window | None = None, parse: Callable = layout.parse_record, fast: bool = True):
        self.buffer = buffer
        self.writer = writer
        self.pcapng = writer.fmt == "pcapng"
        self.options = options or (lambda rec: {})
        self.parse = parse
        self.left = limit
        self.window = window or order.Window()
        self.written = 0
        self.held = False   # (held records wait for the next wake-up: a perf ring wakes per watermark written)
        self.reached = False   # -c within reach: detach, then the last pass (fcap.live.order.reached)
        self._tails: dict[bytes, tuple[bytes, bytes, bytes]] = {}
        self._addresses: list | None = None   # where each ring's data bytes lie (fcap.live.perfwalk reads them)
        self._blocks = None                     # pcapng's block parts as arrays (fcap.live.perfwalk.Blocks)
        self.fast = fast and FAST.wait() is not None   # passes at C speed (fcap.live.perfwalk; made before
        #  `listening on`, as RingDrain: a flood that starts at once is drained at C speed from its start)

    @property
    def done(self) -> bool:
        return self.left > 0 and self.written >= self.left

    def __call__(self, final: bool = False) -> int:
        """One pass: write what is surely published (everything when `final`: the programs are detached)."""
        cutoff = self.window.cutoff(final)
        if self.fast:
            n = self._arrays(FAST.module, cutoff, final)
            if n is not None:
                return n
        walks = [self._walk(ring) for ring in self.buffer.rings]
        if any(w.end - w.start >= ring.size // 4 for w, ring in zip(walks, self.buffer.rings)):
            cutoff = self.window.pressed(cutoff)
        batches = [w.ts for w in walks]
        if not final and order.reached(sum(map(len, batches)), self.left - self.written if self.left else 0):
            self.reached = True
            for w in walks:   # (walked again by the last pass)
                w.parts.clear()
            return 0
        runs, takes = order.merge(self.window, batches, [order.is_sorted(ts) for ts in batches], cutoff,
                                  self.left - self.written if self.left else -1)
        per = EPB_PARTS if self.pcapng else 1
        out: list = []
        for i, a, b in runs:
            out += walks[i].parts[a * per:b * per]
        try:
            if out:
                self.writer.writev(out)
        finally:
            out.clear()   # the slices must go before the rings can be given back
            for w in walks:
                w.parts.clear()
        for ring, w, k in zip(self.buffer.rings, walks, takes):
            self._release(ring, w, k)
        n = order.count(runs)
        self.written += n
        return n

    def _arrays(self, fast, cutoff: int, final: bool) -> int | None:
        """The pass at C speed: each ring's records found, read and laid out as arrays (fcap.live.perfwalk), merged
        by one sort (fcap.live.fastmerge); None, with nothing taken, where a record needs Python to lay it out."""
        from fcap.live import perfwalk
        rings = self.buffer.rings
        if self._addresses is None:
            self._addresses = [r.address() for r in rings]
        got = [perfwalk.read(r, a) for r, a in zip(rings, self._addresses)]
        if not self._laid_out(perfwalk, got):
            return None
        if any(g.end - g.start >= r.size // 4 for g, r in zip(got, rings)):
            cutoff = self.window.pressed(cutoff)
        left = self.left - self.written if self.left else 0
        if not final and order.reached(sum(map(len, got)), left):
            self.reached = True
            return 0
        ks = [fast.eligible(g.ts, cutoff, bool(len(g.ts) < 2 or (g.ts[1:] >= g.ts[:-1]).all())) for g in got]
        p = perfwalk.merge(got, ks, left or -1, self.window.last)
        _write_plan(self.writer, self.window, p)
        for r, g, k in zip(rings, got, p.takes):
            self._release(r, g, k)
        self.written += p.count
        return p.count

    def _laid_out(self, perfwalk, got: list) -> bool:
        """The rings' file records located (pcap) or laid out (pcapng); False where one needs Python."""
        if not all(g.simple for g in got):
            return False
        if not self.pcapng:
            for g in got:
                perfwalk.pcap(g)
            return True
        self._blocks = self._blocks or perfwalk.Blocks()
        return all(perfwalk.epb(g, self._blocks, self._tail) for g in got)

    def _release(self, ring, w, k: int) -> None:
        """Give back the ring's bytes up to the k records taken (all of them: the whole walk); LOST records before
        that point are counted (later ones are walked again). `w`: a _Walk, or perfwalk's RingRecords."""
        at = w.end if k == len(w.ts) else (int(w.ends[k - 1]) if k else w.start)
        self.buffer.lost += sum(n for pos, n in w.lost if pos <= at)
        ring.release(at)

    def _walk(self, ring) -> _Walk:  # noqa: C901 - the per-record hot loop, one copy per format: no calls per record
        tail, head = ring.span()
        w = _Walk(tail)
        if tail >= head:
            w.end = tail
            return w
        data, mask, size = ring.data, ring.mask, ring.size
        out, ts, ends = w.parts, w.ts, w.ends
        app, tsapp, endapp = out.append, ts.append, ends.append
        if self.pcapng:
            unpack, tails, ext = _PCAPNG.unpack_from, self._tails, out.extend
            while tail < head:
                off = tail & mask
                if off + SPAN <= size:
                    rtype, rsize, t, key, fast = unpack(data, off)
                    if rtype == SAMPLE and fast and off + RAW + META_SIZE + fast <= size:
                        parts = tails.get(key)
                        if parts is None:
                            parts = self._tail(key, data[off + RAW:off + RAW + META_SIZE])
                        s = off + RAW
                        ext((parts[0], data[s + _IFACE:s + META_SIZE + fast], parts[1],
                             data[s + _ID_AT:s + _ID_AT + 8], parts[2]))
                        tsapp(t)
                        tail += rsize
                        endapp(tail)
                        continue
                else:
                    rsize = _rsize(data, off, size)
                if rsize < 8:   # corrupt: give up on this ring's backlog
                    tail = head
                    break
                self._slow(w, data, off, size, rsize, tail)
                tail += rsize
        else:
            unpack = _PCAP.unpack_from
            start, end = RAW + PCAP_REC, RAW + META_SIZE
            while tail < head:
                off = tail & mask
                if off + SPAN <= size:
                    rtype, rsize, t, fast = unpack(data, off)
                    if rtype == SAMPLE and fast and off + end + fast <= size:
                        app(data[off + start:off + end + fast])
                        tsapp(t)
                        tail += rsize
                        endapp(tail)
                        continue
                else:
                    rsize = _rsize(data, off, size)
                if rsize < 8:   # corrupt: give up on this ring's backlog
                    tail = head
                    break
                self._slow(w, data, off, size, rsize, tail)
                tail += rsize
        w.end = tail
        return w

    def _slow(self, w: _Walk, data, off: int, size: int, rsize: int, pos: int) -> None:
        """A record the loop could not slice: LOST, wrapped around the ring's end, or not contiguous."""
        rec = data[off:off + rsize] if off + rsize <= size else _wrapped(data, off, rsize, size)
        rtype = int.from_bytes(rec[0:4], "little")
        if rtype == LOST:
            w.lost.append((pos + rsize, _LOST.unpack_from(rec)[0]))
            return
        if rtype != SAMPLE:
            return
        raw = rec[RAW:RAW + _RAWSIZE.unpack_from(rec)[0]]
        parsed = layout.parse_record(raw)
        if self.pcapng:
            key = bytes(raw[_KEY_AT:_KEY_END])
            head8, before, after = self._tails.get(key) or self._tail(key, raw[:META_SIZE])
            w.parts += (head8 + bytes(raw[_IFACE:META_SIZE]) + parsed.data + before + bytes(raw[_ID_AT:_ID_AT + 8])
                        + after, b"", b"", b"", b"")
        else:
            w.parts.append(bytes(raw[PCAP_REC:META_SIZE]) + parsed.data)
        w.ts.append(parsed.ts_ns)
        w.ends.append(pos + rsize)

    def _tail(self, key: bytes, meta) -> tuple[bytes, bytes, bytes]:
        """The block's first 8 bytes and its options around the packet id's 8 bytes."""
        rec = self.parse(bytes(meta))
        caplen = META.unpack(meta).caplen
        head8, tail = self.writer.epb_parts(caplen, **dict(self.options(rec), packet_id=ID_MARK))
        at = tail.index(_ID_MARK)
        parts = head8, tail[:at], tail[at + 8:]
        if len(self._tails) >= CACHE_MAX:
            self._tails.clear()
        self._tails[key] = parts
        return parts


class _Walk:
    """One ring's records in a pass: per sample its timestamp, end position and parts (1 for pcap, EPB_PARTS for
    pcapng); LOST records as (end position, count); where the walk started and where it ended."""

    __slots__ = ("ts", "ends", "parts", "lost", "start", "end")

    def __init__(self, tail: int):
        self.ts: list = []
        self.ends: list = []
        self.parts: list = []
        self.lost: list = []
        self.start = self.end = tail


def _rsize(data, off: int, size: int) -> int:
    hdr = data[off:off + 8] if off + 8 <= size else _wrapped(data, off, 8, size)
    return int.from_bytes(hdr[6:8], "little")


def _wrapped(data, off: int, length: int, size: int) -> bytes:
    off %= size
    first = min(length, size - off)
    return bytes(data[off:off + first]) + bytes(data[0:length - first])


class RingDrain:
    """Drains the per-CPU file rings (see fcap.kernel.ringrec) into a writer in time order: the programs wrote finished
    pcap/pcapng records there and an index entry per record (its timestamp and end), so the CPUs' records are
    merged without a look at any record: by one numpy sort of the index (fcap.live.fastmerge: the records copied
    into one buffer, or written as (address, length) pairs), or where numpy is missing (or `fast` is False) by runs
    (fcap.live.order, written as byte ranges). Records past the cutoff stay in their ring (tail stops before them)
    until a later pass. `limit` (> 0) stops it after that many, the oldest (fcap.live.order.reached). The perf
    buffer only carries doorbells."""

    def __init__(self, ring_map, ring_size: int, buffer: PerfBuffer, writer, limit: int = 0,
                 window: order.Window | None = None, fast: bool = True):
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
        self.fast = fast and len(self.bases) > 1   # merge through fcap.live.fastmerge once it is imported
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
        if not final and order.reached(sum(new for _at, new in spans), self.left - self.written if self.left else 0):
            self.reached = True
            return 0
        if pressed:
            cutoff = self.window.pressed(cutoff)
        # (records on one CPU only are one run: written as one range, nothing to sort)
        fast = FAST.module if self.fast and sum(1 for _at, new in spans if new) > 1 else None
        n = self._fast(fast, spans, cutoff) if fast is not None else self._by_runs(spans, cutoff)
        self.written += n
        return n

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

    def _fast(self, fast, spans: list, cutoff: int) -> int:
        """The pass through fcap.live.fastmerge: one sort of every record's timestamp, the records copied in that
        order into one buffer, or written as (address, length) pairs."""
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
        p = fast.plan(entries, firsts, rings, self.size, self.left - self.written if self.left else -1,
                      self.window.last, self.np_bytes)
        _write_plan(self.writer, self.window, p)
        ends = [e[:, 1] for e in entries]
        self._advance(p.takes, ends, [n for _at, n in spans])
        return p.count

    def _entries(self, fast, i: int, at: int, new: int):
        """CPU i's `new` index entries from word `at`, flat: a view, or a copy where they wrap around its end."""
        w, end, limit = self.np_words, at + 2 * new, self.index[i] + 2 * self.entries
        if end <= limit:
            return w[at:end]
        return fast.np.concatenate((w[at:limit], w[self.index[i]:self.index[i] + end - limit]))

    def _by_runs(self, spans: list, cutoff: int) -> int:
        """The pass through fcap.live.order: runs of each CPU's records, merged in Python (where numpy is not
        installed)."""
        batches, ends = self._new(spans)
        try:
            runs, takes = order.merge(self.window, batches, self.ordered, cutoff,
                                      self.left - self.written if self.left else -1)
            self._write(runs, ends)
            self._advance(takes, ends, [len(b) for b in batches])
            return order.count(runs)
        finally:
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

    def _write(self, runs: list, ends: list) -> None:
        if not runs:
            return
        view, size, hmask = self.view, self.size, layout.HEAD_POS
        parts = []
        for i, a, b in runs:
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


class _Fast:
    """fcap.live.fastmerge (numpy), imported on a thread of its own from the time a session knows it will write
    file rings (Session.open: the ~90 ms of numpy's import run beside the programs' verification) until a drain of
    several rings is made, which waits for it; where numpy is not installed, drains merge through fcap.live.order."""

    def __init__(self):
        self.module = None
        self.missing = ""          # why it could not be imported
        self._thread: threading.Thread | None = None

    def load(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._import, name="fcap-fastmerge", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None):
        """The module once imported (None: not installed), loading it first if need be."""
        self.load()
        self._thread.join(timeout)
        return self.module

    def _import(self) -> None:
        try:
            from fcap.live import fastmerge
        except ImportError as e:
            self.missing = str(e)
            return
        self.module = fastmerge


FAST = _Fast()


def _write_plan(writer, window: order.Window, p) -> None:
    """A fastmerge.Plan's records written (one buffer, or (address, length) pairs) and told to the window."""
    if p.data is not None or p.iov is not None:
        window.wrote(p.late, p.newest, p.oldest)
    try:
        if p.data is not None:
            writer.writev([p.data])
        elif p.iov is not None:
            writer.write_iov(p.iov)
    finally:
        if p.data is not None:
            p.data.release()


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
