"""Capture records to the file without per-record objects: FileDrain slices perf samples (whose record header the
program laid out) into os.writev batches; RingDrain writes the file rings' finished records (fcap.ringrec) as they
are."""

from __future__ import annotations

import struct
from typing import Callable

from bpf.perfbuf import PerfBuffer
from bpf.uapi import PerfRecord

from . import layout
from .layout import META, META_SIZE, PCAP_REC, RING

RAW = 12                        # perf_event_header + the raw sample's u32 size: the sample's bytes start here
SAMPLE, LOST = int(PerfRecord.SAMPLE), int(PerfRecord.LOST)
_LOST = struct.Struct("<8xQ")   # (id,) lost, after the perf_event_header
_RAWSIZE = struct.Struct("<8xI")
# one unpack per record: type, size, (pcapng: the metadata that decides the block's options), FAST
_FAST = META.off("fast")
_IFACE = META.off("iface")        # an EPB's header after its type and length (epb_parts makes those 8 bytes)
_PCAP = struct.Struct(f"<I2xH4x{_FAST}xI")
# the blocks' options are cached by the metadata they show, from skb to fast; the packet id (before them) is each
# record's own, written into the cached options at ID_MARK's place
_KEY_AT, _KEY_END = META.off("skb"), _FAST
_ID_AT = META.off("id")
assert _ID_AT + 8 <= _KEY_AT
ID_MARK = 0xFCA1D0FCA1D0FCA1
_ID_MARK = ID_MARK.to_bytes(8, "little")
_PCAPNG = struct.Struct(f"<I2xH4x{_KEY_AT}x{_KEY_END - _KEY_AT}sI")
SPAN = RAW + META.end("fast")     # bytes of a record the unpack reads
CACHE_MAX = 1 << 14

# For a pcapng block: the options of a record (epb_parts' keyword arguments; fcap.epbopts.Options)
Options = Callable[[layout.Record], dict]


class FileDrain:
    """Drains a session's perf buffer into a pcap/pcapng writer. Call it to drain once; it returns how many
    records it wrote. `limit` (when > 0) stops it after that many records in all. pcapng blocks get their
    options from `options(record)`, cached by the metadata they depend on."""

    def __init__(self, buffer: PerfBuffer, writer, options: Options | None = None, limit: int = 0):
        self.buffer = buffer
        self.writer = writer
        self.pcapng = writer.fmt == "pcapng"
        self.options = options or (lambda rec: {})
        self.left = limit
        self.written = 0
        self._tails: dict[bytes, tuple[bytes, bytes, bytes]] = {}

    @property
    def done(self) -> bool:
        return self.left > 0 and self.written >= self.left

    def __call__(self) -> int:
        n = 0
        for ring in self.buffer.rings:
            if self.done:
                break
            n += self._ring(ring)
        return n

    def _ring(self, ring) -> int:  # noqa: C901 - the per-record hot loop, one copy per format: no calls per record
        tail, head = ring.span()
        if tail >= head:
            return 0
        data, mask, size = ring.data, ring.mask, ring.size
        out: list = []
        app = out.append
        n = 0
        room = self.left - self.written if self.left else -1
        if self.pcapng:
            unpack, tails, ext = _PCAPNG.unpack_from, self._tails, out.extend
            while tail < head and n != room:
                off = tail & mask
                if off + SPAN <= size:
                    rtype, rsize, key, fast = unpack(data, off)
                    if rtype == SAMPLE and fast and off + RAW + META_SIZE + fast <= size:
                        parts = tails.get(key)
                        if parts is None:
                            parts = self._tail(key, data[off + RAW:off + RAW + META_SIZE])
                        s = off + RAW
                        ext((parts[0], data[s + _IFACE:s + META_SIZE + fast], parts[1],
                             data[s + _ID_AT:s + _ID_AT + 8], parts[2]))
                        n += 1
                        tail += rsize
                        continue
                else:
                    rsize = _rsize(data, off, size)
                if rsize < 8:   # corrupt: give up on this ring's backlog
                    tail = head
                    break
                n += self._slow(data, off, size, rsize, app)
                tail += rsize
        else:
            unpack = _PCAP.unpack_from
            start, end = RAW + PCAP_REC, RAW + META_SIZE
            while tail < head and n != room:
                off = tail & mask
                if off + SPAN <= size:
                    rtype, rsize, fast = unpack(data, off)
                    if rtype == SAMPLE and fast and off + end + fast <= size:
                        app(data[off + start:off + end + fast])
                        n += 1
                        tail += rsize
                        continue
                else:
                    rsize = _rsize(data, off, size)
                if rsize < 8:   # corrupt: give up on this ring's backlog
                    tail = head
                    break
                n += self._slow(data, off, size, rsize, app)
                tail += rsize
        if out:
            try:
                self.writer.writev(out)
            finally:
                out.clear()   # the slices must go before the ring can be given back
        ring.release(tail)
        self.written += n
        return n

    def _slow(self, data, off: int, size: int, rsize: int, app) -> int:
        """A record the loop could not slice: LOST, wrapped around the ring's end, or not contiguous."""
        rec = data[off:off + rsize] if off + rsize <= size else _wrapped(data, off, rsize, size)
        rtype = int.from_bytes(rec[0:4], "little")
        if rtype == LOST:
            self.buffer.lost += _LOST.unpack_from(rec)[0]
            return 0
        if rtype != SAMPLE:
            return 0
        raw = rec[RAW:RAW + _RAWSIZE.unpack_from(rec)[0]]
        parsed = layout.parse_record(raw)
        if self.pcapng:
            key = bytes(raw[_KEY_AT:_KEY_END])
            head8, before, after = self._tails.get(key) or self._tail(key, raw[:META_SIZE])
            app(head8 + bytes(raw[_IFACE:META_SIZE]) + parsed.data + before + bytes(raw[_ID_AT:_ID_AT + 8]) + after)
        else:
            app(bytes(raw[PCAP_REC:META_SIZE]) + parsed.data)
        return 1

    def _tail(self, key: bytes, meta) -> tuple[bytes, bytes, bytes]:
        """The block's first 8 bytes and its options around the packet id's 8 bytes."""
        rec = layout.parse_record(bytes(meta))
        caplen = META.unpack(meta).caplen
        head8, tail = self.writer.epb_parts(caplen, **dict(self.options(rec), packet_id=ID_MARK))
        at = tail.index(_ID_MARK)
        parts = head8, tail[:at], tail[at + 8:]
        if len(self._tails) >= CACHE_MAX:
            self._tails.clear()
        self._tails[key] = parts
        return parts


def _rsize(data, off: int, size: int) -> int:
    hdr = data[off:off + 8] if off + 8 <= size else _wrapped(data, off, 8, size)
    return int.from_bytes(hdr[6:8], "little")


def _wrapped(data, off: int, length: int, size: int) -> bytes:
    off %= size
    first = min(length, size - off)
    return bytes(data[off:off + first]) + bytes(data[0:length - first])


class RingDrain:
    """Drains the per-CPU file rings (see fcap.ringrec) into a writer: the programs wrote finished pcap/pcapng
    records there, so each CPU's pending bytes go out as one or two slices; the record counts come with HEAD.
    The perf buffer only carries doorbells."""

    done = False

    def __init__(self, ring_map, ring_size: int, buffer: PerfBuffer, writer):
        self.map = ring_map
        self.mm = ring_map.mmap()
        self.view = memoryview(self.mm)
        self.words = self.view.cast("Q")   # control words: stored with one 8-byte store each (never pack_into,
        self.buffer = buffer                # which zeroes the bytes before it writes them)
        self.writer = writer
        self.size = ring_size
        self.bases = [i * ring_map.stride for i in range(ring_map.max_entries)]   # (multiples of 8)
        self.counts = [0] * len(self.bases)
        self.written = 0

    def __call__(self) -> int:
        self.buffer.drain(_ignore)
        view, words, size, n = self.view, self.words, self.size, 0
        for i, base in enumerate(self.bases):
            head = _U64.unpack_from(view, base + RING.off("head"))[0]
            tail = _U64.unpack_from(view, base + RING.off("tail"))[0]
            pos = head & layout.HEAD_POS
            if pos != tail:
                length = (pos - tail) & layout.HEAD_POS
                start = base + RING.size
                t = tail & (size - 1)
                first = min(length, size - t)
                parts = [view[start + t:start + t + first]]
                if length > first:
                    parts.append(view[start:start + length - first])
                try:
                    self.writer.writev(parts)
                finally:
                    for p in parts:
                        p.release()
                words[(base + RING.off("tail")) // 8] = pos
            # the doorbell cleared once tail is stored: cleared before, every record published while the bytes
            # were being written saw the old tail, found the ring a quarter full and rang again (a second wake-up
            # for a few KB after each drain, ~1.6 wake-ups per quarter measured); records published meanwhile wait
            # for the next crossing or the timer, as any below a quarter do
            bell = (base + RING.off("bell")) // 8
            if words[bell]:
                words[bell] = 0
            count = head >> layout.HEAD_BITS
            n += (count - self.counts[i]) & ((1 << (64 - layout.HEAD_BITS)) - 1)
            self.counts[i] = count
        self.written += n
        return n

    def published(self) -> int:
        """Records the programs have published so far: those written plus those not drained yet."""
        if self.view is None:
            return self.written
        mask, left = (1 << (64 - layout.HEAD_BITS)) - 1, 0
        for i, base in enumerate(self.bases):
            head = _U64.unpack_from(self.view, base + RING.off("head"))[0]
            left += ((head >> layout.HEAD_BITS) - self.counts[i]) & mask
        return self.written + left

    def close(self) -> None:
        if self.view is not None:
            self.words.release()
            self.view.release()
            self.view = None
            self.mm.close()


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
