"""BPF ring buffer consumer: consumer page mapped rw, producer page and data double-mapped ro, epoll, batches."""

from __future__ import annotations

import mmap
import select
import struct
from typing import Callable

from .maps import RingBufMap
from .uapi import RINGBUF_BUSY_BIT, RINGBUF_DISCARD_BIT, RINGBUF_HDR_SZ

PAGE = mmap.PAGESIZE
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


class RingBuffer:
    """Reads records a program wrote with bpf_ringbuf_output/reserve+submit."""

    def __init__(self, rb: RingBufMap):
        self.map = rb
        self.size = rb.max_entries
        self.mask = self.size - 1
        fd = rb.fileno()
        self.cons = mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        # the data area is mapped twice in a row, so a record that wraps is contiguous here
        self.prod = mmap.mmap(fd, PAGE + 2 * self.size, mmap.MAP_SHARED, mmap.PROT_READ, offset=PAGE)
        self.cview = memoryview(self.cons)
        self.cpos = self.cview.cast("Q")   # one 8-byte store (struct.pack_into zeroes the bytes first)
        self.pview = memoryview(self.prod)
        self.data = self.pview[PAGE:]
        self.epoll = select.epoll()
        self.epoll.register(fd, select.EPOLLIN)

    def close(self) -> None:
        if self.epoll is None:
            return
        self.epoll.close()
        self.epoll = None
        self.data.release()
        self.pview.release()
        self.cpos.release()
        self.cview.release()
        self.prod.close()
        self.cons.close()

    def poll(self, timeout_ms: int) -> bool:
        try:
            return bool(self.epoll.poll(timeout_ms / 1000 if timeout_ms >= 0 else -1))
        except InterruptedError:
            return False

    def drain(self, on_record: Callable[[memoryview], None], limit: int = 0) -> int:
        """Hand each committed record (a view valid during the call) to on_record; returns how many."""
        cons = _U64.unpack_from(self.cview, 0)[0]
        prod = _U64.unpack_from(self.pview, 0)[0]
        data, mask = self.data, self.mask
        n = 0
        while cons < prod:
            off = cons & mask
            hdr = _U32.unpack_from(data, off)[0]
            if hdr & RINGBUF_BUSY_BIT:
                break
            length = hdr & ~(RINGBUF_BUSY_BIT | RINGBUF_DISCARD_BIT)
            if not hdr & RINGBUF_DISCARD_BIT:
                on_record(data[off + RINGBUF_HDR_SZ: off + RINGBUF_HDR_SZ + length])
                n += 1
            cons += (length + RINGBUF_HDR_SZ + 7) & ~7
            if limit and n >= limit:
                break
        self.cpos[0] = cons
        return n
