"""Perf event ring buffers (one per CPU) behind a PERF_EVENT_ARRAY map: open, mmap, epoll, drain in batches."""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import select
import struct
from typing import Callable

from .maps import PerfEventArrayMap, online_cpus
from .sys import FD, PerfEventAttr, perf_event_open
from .uapi import (PERF_ATTR_FLAG_WATERMARK, PERF_COUNT_SW_BPF_OUTPUT, PERF_FLAG_FD_CLOEXEC, PERF_SAMPLE_RAW,
                   PerfIoctl, PerfRecord, PerfType)

PAGE = mmap.PAGESIZE
_HEAD = struct.Struct("<Q")        # data_head at 1024, data_tail at 1032 in perf_event_mmap_page
_HDR = struct.Struct("<IHHI")      # perf_event_header (type, misc, size) + raw sample size
_LOST = struct.Struct("<QQ")       # id, lost
HEAD_OFF, TAIL_OFF = 1024, 1032

# A sample callback gets (cpu, memoryview of the raw data). It must not keep the view past the call.
Sample = Callable[[int, memoryview], None]


class _CPURing:
    """One CPU's ring: `data` is a memoryview of its `size` data bytes (read and written in place by readers that
    walk the records themselves: span(), release())."""

    __slots__ = ("cpu", "fd", "mm", "view", "size", "mask", "data", "ctl")

    def __init__(self, cpu: int, pages: int, wakeup_bytes: int):
        self.cpu = cpu
        attr = PerfEventAttr(type=PerfType.SOFTWARE, config=PERF_COUNT_SW_BPF_OUTPUT, sample_period=1,
                             sample_type=PERF_SAMPLE_RAW)
        if wakeup_bytes > 1:
            attr.flags = PERF_ATTR_FLAG_WATERMARK
            attr.wakeup = wakeup_bytes
        else:
            attr.wakeup = 1
        self.fd = FD(perf_event_open(attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC, f"open perf buffer on CPU {cpu}"))
        self.size = pages * PAGE
        self.mask = self.size - 1
        self.mm = mmap.mmap(self.fd.fd, PAGE + self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self.mm)
        self.data = self.view[PAGE:]
        # data_tail is stored through a u64 view: one 8-byte store (struct.pack_into zeroes its bytes before it
        # writes them, and the kernel, reading a tail of 0 meanwhile, would see a full ring and drop)
        self.ctl = self.view[:PAGE].cast("Q")
        fcntl.ioctl(self.fd.fd, PerfIoctl.ENABLE, 0)

    def span(self) -> tuple[int, int]:
        """(tail, head): the records in [tail, head) are ours to read (positions; & mask gives the offset in
        data). Records stay valid until release()."""
        return _HEAD.unpack_from(self.view, TAIL_OFF)[0], _HEAD.unpack_from(self.view, HEAD_OFF)[0]

    def address(self) -> int:
        """Where the data bytes lie in memory (for readers that view them as arrays without exporting the mapping:
        valid until close())."""
        ref = ctypes.c_char.from_buffer(self.mm, PAGE)
        try:
            return ctypes.addressof(ref)
        finally:
            del ref

    def release(self, tail: int) -> None:
        """Give the bytes before position `tail` back to the kernel."""
        self.ctl[TAIL_OFF // 8] = tail

    def close(self) -> None:
        if self.view is not None:
            self.ctl.release()
            self.data.release()
            self.view.release()
            self.view = self.data = None
            self.mm.close()
        self.fd.close()


class PerfBuffer:
    """Per-CPU perf rings for a PERF_EVENT_ARRAY map: `pages` (a power of two) data pages each.
    `wakeup_bytes` > 1: the kernel wakes the reader only once that many bytes are pending (a timer in poll()
    covers the rest)."""

    def __init__(self, events: PerfEventArrayMap, pages: int = 64, wakeup_bytes: int = 0,
                 cpus: list[int] | None = None):
        if pages < 1 or pages & (pages - 1):
            raise ValueError(f"perf buffer pages {pages} must be a power of two")
        self.rings: list[_CPURing] = []
        self.lost = 0
        self.epoll = select.epoll()
        try:
            for cpu in cpus if cpus is not None else online_cpus():
                ring = _CPURing(cpu, pages, min(wakeup_bytes, pages * PAGE // 2))
                self.rings.append(ring)
                events.update(cpu, ring.fd.fd.to_bytes(4, "little"))
                self.epoll.register(ring.fd.fd, select.EPOLLIN)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for r in self.rings:
            try:
                fcntl.ioctl(r.fd.fd, PerfIoctl.DISABLE, 0)
            except (OSError, ValueError):
                pass
            r.close()
        self.rings = []
        self.epoll.close()

    def fileno(self) -> int:
        return self.epoll.fileno()

    def watch(self, fd: int) -> None:
        """poll() returns as soon as fd is readable too (e.g. a signal's wake-up fd: a stop without waiting for
        the timeout)."""
        self.epoll.register(fd, select.EPOLLIN)

    def poll(self, timeout_ms: int) -> bool:
        """Wait until a ring has data to read or the time passes; True if woken by data."""
        try:
            return bool(self.epoll.poll(timeout_ms / 1000 if timeout_ms >= 0 else -1))
        except InterruptedError:
            return False

    def pending(self) -> int:
        return sum((_HEAD.unpack_from(r.view, HEAD_OFF)[0] - _HEAD.unpack_from(r.view, TAIL_OFF)[0])
                   for r in self.rings)

    def drain(self, on_sample: Sample, limit: int = 0) -> int:
        """Hand every pending sample to on_sample; returns how many. LOST records add to self.lost."""
        n = 0
        for r in self.rings:
            n += self._drain_ring(r, on_sample, limit - n if limit else 0)
            if limit and n >= limit:
                break
        return n

    def _drain_ring(self, r: _CPURing, on_sample: Sample, limit: int) -> int:
        view, data, mask, size, cpu = r.view, r.data, r.mask, r.size, r.cpu
        head = _HEAD.unpack_from(view, HEAD_OFF)[0]
        tail = _HEAD.unpack_from(view, TAIL_OFF)[0]
        n = 0
        unpack = _HDR.unpack_from
        while tail < head:
            off = tail & mask
            if off + 12 <= size:
                rtype, _misc, rsize, raw = unpack(data, off)
            else:
                rtype, _misc, rsize, raw = unpack(self._wrapped(data, off, 12, size))
            if rsize < 8:  # corrupt: give up on this ring's backlog
                tail = head
                break
            if rtype == PerfRecord.SAMPLE:
                start = off + 12
                if start + raw <= size:
                    on_sample(cpu, data[start:start + raw])
                else:
                    on_sample(cpu, memoryview(self._wrapped(data, start & mask, raw, size)))
                n += 1
            elif rtype == PerfRecord.LOST:
                rec = self._wrapped(data, off, rsize, size) if off + rsize > size else data[off:off + rsize]
                self.lost += _LOST.unpack_from(rec, 8)[1]
            tail += rsize
            if limit and n >= limit:
                break
        r.ctl[TAIL_OFF // 8] = tail
        return n

    @staticmethod
    def _wrapped(data: memoryview, off: int, length: int, size: int) -> bytes:
        off %= size
        first = min(length, size - off)
        return bytes(data[off:off + first]) + bytes(data[0:length - first])
