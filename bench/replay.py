"""K CPUs' file rings in the capture program's own layout (fcap.kernel.layout's RING control words, the ring and its
slack, the index; fcap.kernel.ringrec), in shared memory rather than a BPF map, filled from user space the way the
program fills them: so that the real drain (fcap.live.ringdrain.RingDrain) can be run over any number of CPUs on any
machine (bench/drain.py, tests/test_merge.py)."""

from __future__ import annotations

import mmap
import os
import struct

from fcap.kernel import layout
from fcap.kernel.layout import HEAD_BITS, HEAD_POS, RING
from fcap.kernel.ringrec import element_size, index_at, index_entries

_Q = struct.Struct("=Q")
_PCAP_HDR = struct.Struct("=IIII")
NS = 1_000_000_000


class ReplayRings:
    """The rings' memory (a memfd), with what RingDrain asks of a map: mmap(), stride, max_entries."""

    def __init__(self, cpus: int, ring_size: int):
        self.max_entries = cpus
        self.ring_size = ring_size
        self.stride = (element_size(ring_size) + 7) & ~7
        self.entries = index_entries(ring_size)
        self.fd = os.memfd_create("fcap-replay")
        os.ftruncate(self.fd, self._size())
        self.mm = self.mmap()
        self.head = [0] * cpus       # position bits and count, as the program keeps head

    def _size(self) -> int:
        return (self.stride * self.max_entries + mmap.PAGESIZE - 1) & ~(mmap.PAGESIZE - 1)

    def mmap(self):
        return mmap.mmap(self.fd, self._size(), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def word(self, cpu: int, name: str) -> int:
        return _Q.unpack_from(self.mm, cpu * self.stride + RING.off(name))[0]

    def room(self, cpu: int, length: int) -> bool:
        """Whether the program would take a record of `length` bytes on this CPU now (the index and the bytes)."""
        head = self.head[cpu]
        if (head >> HEAD_BITS) - self.word(cpu, "taken") >= self.entries:
            return False
        return ((head & HEAD_POS) - self.word(cpu, "tail")) + length <= self.ring_size

    def publish(self, cpu: int, ts: int, record: bytes) -> bool:
        """One finished record on this CPU's ring, as the program publishes it: its bytes (the part past the ring's
        end also at its start), its index entry, then head. False (nothing written) where the program would
        count it lost."""
        n = len(record)
        if not self.room(cpu, n):
            return False
        base = cpu * self.stride
        head = self.head[cpu]
        pos = head & HEAD_POS
        off = pos & (self.ring_size - 1)
        data = base + layout.RING_CTRL
        self.mm[data + off:data + off + n] = record
        over = off + n - self.ring_size
        if over > 0:
            self.mm[data:data + over] = record[n - over:]
        slot = base + index_at(self.ring_size) + ((head >> HEAD_BITS) & (self.entries - 1)) * 16
        end = (pos + n) & HEAD_POS
        self.mm[slot:slot + 16] = _Q.pack(ts) + _Q.pack(end)
        last = self.word(cpu, "last")
        if ts < last:
            _Q.pack_into(self.mm, base + RING.off("disorder"), self.word(cpu, "disorder") + 1)
        _Q.pack_into(self.mm, base + RING.off("last"), ts)
        self.head[cpu] = ((head >> HEAD_BITS) + 1) << HEAD_BITS | end
        _Q.pack_into(self.mm, base + RING.off("head"), self.head[cpu])
        return True

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


def pcap_record(ts_ns: int, frame: bytes) -> bytes:
    """A pcap record as the program lays it out (nanosecond timestamps)."""
    return _PCAP_HDR.pack(ts_ns // NS, ts_ns % NS, len(frame), len(frame)) + frame


class Doorbells:
    """The perf buffer's part in a RingDrain (doorbells only): none rings here."""

    lost = 0

    def drain(self, callback) -> int:
        return 0
