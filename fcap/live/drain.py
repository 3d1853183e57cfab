"""Capture records to the file without per-record objects: FileDrain slices perf samples (whose record header the
program laid out) into os.writev batches, or finds, reads and lays them out as arrays (fcap.live.perfwalk); the
file rings' drain is fcap.live.ringdrain's. FAST: the numpy merge both use (fcap.live.fastmerge), imported early."""

from __future__ import annotations

import struct
import threading
import time
from typing import Callable

from bpf.perfbuf import PerfBuffer
from bpf.uapi import PerfRecord

from fcap.defaults import BLOCK_CACHE_BYTES, BLOCK_CACHE_MAX
from fcap.kernel import layout

from fcap.live import order
from fcap.kernel.layout import META, META_SIZE, PCAP_REC

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
# the cached options at ID_MARK's place (pcapng's unpack, per drain: FileDrain's _unpack_ng, its key after the bytes
# before META too)
_KEY_AT, _KEY_END = META.off("skb"), _FAST
_ID_AT = META.off("id")
ID_MARK = 0xFCA1D0FCA1D0FCA1
_ID_MARK = ID_MARK.to_bytes(8, "little")
EPB_PARTS = 5   # writev parts of a pcapng record: its first 8 bytes, header and bytes, options to the id, id, the rest
SPAN = RAW + META.end("fast")     # bytes of a record the unpack reads
# a writer's fmt for records as the programs wrote them, their metadata with them: each record's META (its `fast`
# and caplen the length of the bytes), then the packet's bytes (--json's, fcap.live.jsonlines.JsonWriter)
WITH_META = "meta"
_FAST_FIELD = struct.Struct("<I")

# For a pcapng block: the options of a record (epb_parts' keyword arguments; fcap.features.notes.RecordNotes)
RecordOptions = Callable[[layout.Record], dict]


class FileDrain:
    """Drains a session's perf buffer into a pcap/pcapng writer in time order. Call it to drain once; it returns how
    many records it wrote. Each CPU's records are walked (one unpack each: type, size, timestamp), merged by time
    (fcap.live.order) and written with os.writev; records past the cutoff stay in their ring for a later pass. With
    numpy (`fast`), a pass finds, reads, lays out and merges them as arrays instead (fcap.live.perfwalk).
    `limit` (when > 0) stops it after that many records in all, the oldest (fcap.live.order.reached). pcapng blocks
    get their options from `options(record)`, cached by the metadata they depend on (the record made by `parse`:
    the session's, which names --stack's frames from META's stack id). `lead`: the bytes each sample holds before
    its META (--dump's area, fcap.kernel.dumps.Area: its dumps' options depend on them, so the cache's key holds
    them too)."""

    def __init__(self, buffer: PerfBuffer, writer, options: RecordOptions | None = None, limit: int = 0,
                 window: order.Window | None = None, parse: Callable = layout.parse_record, fast: bool = True,
                 lead: int = 0, refresh_ns: int = 0):
        self.buffer = buffer
        self.writer = writer
        self.pcapng = writer.fmt == "pcapng"
        self.head = 0 if writer.fmt == WITH_META else PCAP_REC   # where in META the records the writer takes start
        self.options = options or (lambda rec: {})
        self.parse = parse
        self.left = limit
        self.window = window or order.Window()
        self.written = 0
        self.held = False   # (held records wait for the next wake-up: a perf ring wakes per watermark written)
        self.reached = False   # -c within reach: detach, then the last pass (fcap.live.order.reached)
        self._tails: dict[bytes, tuple[bytes, bytes, bytes]] = {}
        self._cached = 0   # (their bytes)
        self._addresses: list | None = None   # where each ring's data bytes lie (fcap.live.perfwalk reads them)
        self._blocks = None                     # pcapng's block parts as arrays (fcap.live.perfwalk.Blocks)
        self.lead = lead
        self.refresh_ns = refresh_ns   # (> 0: the options cached are made again after this long: names found since)
        self._since = time.monotonic_ns()
        self._unpack_ng = struct.Struct(f"<I2xH4x{lead}sQ{_KEY_AT - _TS_END}x{_KEY_END - _KEY_AT}sI").unpack_from
        # passes at C speed (fcap.live.perfwalk; made before `listening on`, as RingDrain: a flood that starts at
        # once is drained at C speed from its start)
        self.fast = fast and lead % 8 == 0 and FAST.wait() is not None

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
        walks = self.walks()
        if self.pressed(walks):
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
        self.release(walks, takes)
        n = order.count(runs)
        self.written += n
        return n

    def _arrays(self, fast, cutoff: int, final: bool) -> int | None:
        """The pass at C speed: each ring's records found, read and laid out as arrays (fcap.live.perfwalk), merged
        by one sort (fcap.live.fastmerge); None, with nothing taken, where a record needs Python to lay it out."""
        from fcap.live import perfwalk
        got = self.arrays(planned=True)
        if got is None:
            return None
        if self.pressed(got):
            cutoff = self.window.pressed(cutoff)
        left = self.left - self.written if self.left else 0
        if not final and order.reached(sum(map(len, got)), left):
            self.reached = True
            return 0
        ks = before_cutoff(fast, got, cutoff)
        p = perfwalk.merge(got, ks, left or -1, self.window.last, self._blocks if self.pcapng else None)
        write_plan(self.writer, self.window, p)
        self.release(got, p.takes)
        self.written += p.count
        return p.count

    def arrays(self, planned: bool = False) -> list | None:
        """Each ring's pending records found, read and laid out as arrays (fcap.live.perfwalk's RingRecords; pcapng's
        blocks only `planned`, for perfwalk.merge to lay out in time order); None where one needs Python to lay it
        out (the per-record walk: walks())."""
        from fcap.live import perfwalk
        self._refresh()
        rings = self.buffer.rings
        if self._addresses is None:
            self._addresses = [r.address() for r in rings]
        got = [perfwalk.read(r, a, self.lead) for r, a in zip(rings, self._addresses)]
        return got if self._laid_out(perfwalk, got, planned) else None

    def walks(self) -> list:
        """Each ring's pending records walked one by one (Walk: their file records as parts, EPB_PARTS each for
        pcapng; their timestamps). Clear their parts before the rings are released."""
        self._refresh()
        return [self._walk(ring) for ring in self.buffer.rings]

    def _refresh(self) -> None:
        """Forget the options cached, once refresh_ns have passed (between passes)."""
        if self.refresh_ns and time.monotonic_ns() - self._since >= self.refresh_ns:
            self._tails, self._cached, self._blocks = {}, 0, None
            self._since = time.monotonic_ns()

    def pending(self) -> bool:
        """Whether any ring holds a record (or a count of lost ones) not released yet."""
        return any(tail < head for tail, head in (r.span() for r in self.buffer.rings))

    def pressed(self, got: list) -> bool:
        """Whether a ring is a quarter full or more (got: arrays() or walks())."""
        return any(g.end - g.start >= r.size // 4 for g, r in zip(got, self.buffer.rings))

    def release(self, got: list, takes: list) -> None:
        """Give back each ring's bytes up to the records taken of it."""
        for r, g, k in zip(self.buffer.rings, got, takes):
            self._release(r, g, k)

    def _laid_out(self, perfwalk, got: list, planned: bool = False) -> bool:
        """The rings' file records located (pcap) or laid out (pcapng; only planned where `planned`); False where one
        needs Python."""
        if not all(g.simple for g in got):
            return False
        if not self.pcapng:
            for g in got:
                perfwalk.pcap(g, self.head)
            return True
        self._blocks = self._blocks or perfwalk.Blocks(self.lead)
        self._blocks.trim()
        lay = perfwalk.planned_epb if planned else perfwalk.epb
        return all(lay(g, self._blocks, self._tail) for g in got)

    def _release(self, ring, w, k: int) -> None:
        """Give back the ring's bytes up to the k records taken (all of them: the whole walk); LOST records before
        that point are counted (later ones are walked again). `w`: a Walk, or perfwalk's RingRecords."""
        at = w.end if k == len(w.ts) else (int(w.ends[k - 1]) if k else w.start)
        self.buffer.lost += sum(n for pos, n in w.lost if pos <= at)
        ring.release(at)

    def _walk(self, ring) -> Walk:  # noqa: C901 - the per-record hot loop, one copy per format: no calls per record
        tail, head = ring.span()
        w = Walk(tail)
        if tail >= head:
            w.end = tail
            return w
        data, mask, size = ring.data, ring.mask, ring.size
        out, ts, ends = w.parts, w.ts, w.ends
        app, tsapp, endapp = out.append, ts.append, ends.append
        if self.pcapng:
            # (the cache's key: the bytes before META, --dump's area, and META's; b"" + bytes is the bytes as they are)
            unpack, tails, ext, lead = self._unpack_ng, self._tails, out.extend, self.lead
            span, body = SPAN + lead, RAW + lead + META_SIZE
            while tail < head:
                off = tail & mask
                if off + span <= size:
                    rtype, rsize, area, t, key, fast = unpack(data, off)
                    if rtype == SAMPLE and fast and off + body + fast <= size:
                        key = area + key
                        parts = tails.get(key)
                        if parts is None:
                            parts = self._tail(key, data[off + RAW:off + body])
                        s = off + RAW + lead
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
            start, end = RAW + self.head, RAW + META_SIZE
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

    def _slow(self, w: Walk, data, off: int, size: int, rsize: int, pos: int) -> None:
        """A record the loop could not slice: LOST, wrapped around the ring's end, or not contiguous."""
        rec = data[off:off + rsize] if off + rsize <= size else _wrapped(data, off, rsize, size)
        rtype = int.from_bytes(rec[0:4], "little")
        if rtype == LOST:
            w.lost.append((pos + rsize, _LOST.unpack_from(rec)[0]))
            return
        if rtype != SAMPLE:
            return
        sample = rec[RAW:RAW + _RAWSIZE.unpack_from(rec)[0]]
        lead = self.lead
        raw = sample[lead:]
        parsed = layout.parse_record(raw)
        if self.pcapng:
            key = bytes(sample[:lead]) + bytes(raw[_KEY_AT:_KEY_END])
            head8, before, after = self._tails.get(key) or self._tail(key, sample[:lead + META_SIZE])
            w.parts += (head8 + bytes(raw[_IFACE:META_SIZE]) + parsed.data + before + bytes(raw[_ID_AT:_ID_AT + 8])
                        + after, b"", b"", b"", b"")
        elif self.head:
            w.parts.append(bytes(raw[PCAP_REC:META_SIZE]) + parsed.data)
        else:   # (its bytes now contiguous: `fast` says how many)
            meta = bytearray(raw[:META_SIZE])
            _FAST_FIELD.pack_into(meta, _FAST, len(parsed.data))
            w.parts.append(bytes(meta) + parsed.data)
        w.ts.append(parsed.ts_ns)
        w.ends.append(pos + rsize)

    def _tail(self, key, meta) -> tuple[bytes, bytes, bytes]:
        """The block's first 8 bytes and its options around the packet id's 8 bytes (meta: the sample's bytes up
        to the end of its META)."""
        rec = self.parse(bytes(meta))
        caplen = META.unpack(meta, self.lead).caplen
        head8, tail = self.writer.epb_parts(caplen, **dict(self.options(rec), packet_id=ID_MARK))
        at = tail.index(_ID_MARK)
        parts = head8, tail[:at], tail[at + 8:]
        self._cached += len(tail) + self.lead
        if len(self._tails) >= BLOCK_CACHE_MAX or self._cached > BLOCK_CACHE_BYTES:
            self._tails.clear()
            self._cached = len(tail) + self.lead
        self._tails[key] = parts
        return parts


class Walk:
    """One ring's records in a pass: per sample its timestamp, end position and parts (1 for pcap, EPB_PARTS for
    pcapng); LOST records as (end position, count); where the walk started and where it ended."""

    __slots__ = ("ts", "ends", "parts", "lost", "start", "end")

    def __init__(self, tail: int):
        self.ts: list = []
        self.ends: list = []
        self.parts: list = []
        self.lost: list = []
        self.start = self.end = tail

    def __len__(self) -> int:
        return len(self.ts)


def _rsize(data, off: int, size: int) -> int:
    hdr = data[off:off + 8] if off + 8 <= size else _wrapped(data, off, 8, size)
    return int.from_bytes(hdr[6:8], "little")


def _wrapped(data, off: int, length: int, size: int) -> bytes:
    off %= size
    first = min(length, size - off)
    return bytes(data[off:off + first]) + bytes(data[0:length - first])

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
            from fcap.live import perfwalk  # noqa: F401 (the perf buffers' walk: a first pass waits not for it)
        except ImportError as e:
            self.missing = str(e)
            return
        self.module = fastmerge


FAST = _Fast()


def before_cutoff(fast, got: list, cutoff: int) -> list:
    """How many of each perf ring's records (perfwalk's RingRecords) lie before the cutoff."""
    return [fast.eligible(g.ts, cutoff, bool(len(g.ts) < 2 or (g.ts[1:] >= g.ts[:-1]).all())) for g in got]


def write_plan(writer, window: order.Window, p) -> None:
    """A fastmerge.Plan's records written (one buffer, or (address, length) pairs) and told to the window."""
    if p.data is not None or p.iov is not None:
        window.wrote(p.late, p.newest, p.oldest)
    try:
        if p.data is not None and writer.fmt == WITH_META:   # (where each record starts: its writer reads them)
            writer.write_records(p.data, p.starts)
        elif p.data is not None:
            writer.writev([p.data])
        elif p.iov is not None:
            writer.write_iov(p.iov)
    finally:
        if p.data is not None:
            p.data.release()
