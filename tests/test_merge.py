"""The file rings' merge at C speed (fcap.live.fastmerge, fcap.files.iovec) against the runs merge it stands beside
(fcap.live.order): K CPUs' rings filled as the capture program fills them (bench.replay), drained pass by pass
through the real RingDrain into real pcap files, which tcpdump reads back; the two merges' files are the same
bytes, in time order, every record once. Then the records' writer: partial writes into a pipe, a reader that
leaves, a file that fills up, -C's cuts."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import threading

import pytest
from conftest import need_tool

from fcap.files.pcapfile import PcapWriter
from fcap.live import order
from fcap.live.drain import FAST
from fcap.live.ringdrain import RingDrain

FRAME = 14 + 20 + 8 + 16    # a record's packet: Ethernet, IPv4, UDP, then (sequence, CPU) as the payload's start


def _fast():
    module = FAST.wait()
    if module is None:
        pytest.skip(f"numpy's merge cannot be imported: {FAST.missing}")
    return module


def _frame(seq: int, cpu: int, extra: int) -> bytes:
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + 8 + 16 + extra, 0, 0, 64, 17, 0, bytes([127, 0, 0, 1]),
                     bytes([127, 0, 0, 1]))
    udp = struct.pack(">HHHH", 40000 + cpu, 9, 8 + 16 + extra, 0)
    return bytes(12) + b"\x08\x00" + ip + udp + struct.pack(">QQ", seq, cpu) + bytes(extra)


LENGTHS = {"one": [0], "three": [0, 1, 37], "many": list(range(40))}   # the records' extra bytes: how many lengths


def _workload(k: int, n: int, grain: int, seed: int, lengths: str = "many") -> list[list[tuple[int, int, bytes]]]:
    """Per CPU its records in publishing order: (timestamp, sequence, pcap record). Times interleave every `grain`
    records; the last CPU publishes some records late (older than the one before: an interrupted program). One
    length, three (each pass copied into one buffer: fcap.live.fastmerge.gathered) or many (written as iovecs)."""
    from bench.replay import pcap_record
    rnd = random.Random(seed)
    extra = LENGTHS[lengths]
    base = 10**15
    per = [[] for _ in range(k)]
    for j in range(n):
        for cpu in range(k):
            seq = (j // grain) * grain * k + cpu * grain + j % grain
            ts = base + seq * 1000
            per[cpu].append((ts, seq, pcap_record(ts, _frame(seq, cpu, rnd.choice(extra)))))
    if k > 1:
        mine = per[-1]
        for i in range(1, len(mine) - 1, 17):   # a neighbour pair swapped (within a pass's slice): the later one
            # published first
            mine[i], mine[i + 1] = mine[i + 1], mine[i]
    return per


def _drain(per: list, fast: bool, ring: int, path, passes: int, limit: int = 0) -> int:
    """Publish the records in `passes` slices, draining after each (the rings wrap), into a pcap file."""
    from bench.replay import Doorbells, ReplayRings
    rings = ReplayRings(len(per), ring)
    try:
        with open(path, "wb") as f:
            w = PcapWriter(f, linktype=1, snaplen=262144)
            d = RingDrain(rings, ring, Doorbells(), w, limit=limit, window=order.Window(), fast=fast)
            written = 0
            n = len(per[0])
            for p in range(passes):
                for cpu, recs in enumerate(per):
                    for ts, _seq, rec in recs[p * n // passes:(p + 1) * n // passes]:
                        assert rings.publish(cpu, ts, rec), "a ring too small for the test"
                written += d(final=True)
                if d.done:
                    break
            d.close()
        return written
    finally:
        rings.close()


def _tcpdump_seqs(path) -> list[tuple[int, int]]:
    """(time in ns, sequence) of each record as tcpdump reads the file."""
    tcpdump = need_tool("tcpdump")
    r = subprocess.run([tcpdump, "-r", str(path), "-nn", "--time-stamp-precision=nano", "-tt", "-x"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = []
    for line in r.stdout.splitlines():
        if not line.startswith("\t"):
            sec, frac = line.split()[0].split(".")
            out.append([int(sec) * 10**9 + int(frac), ""])
        else:
            out[-1][1] += "".join(line.split(":", 1)[1].split())
    # the hex dump starts at the IP header: IPv4 20 bytes, UDP 8, then the sequence
    return [(ts, int(hexes[56:72], 16)) for ts, hexes in out]


@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("k, grain", [(2, 1), (4, 3), (16, 1), (16, 15), (64, 1), (64, 3)])
def test_numpy_merge_writes_what_the_runs_merge_writes(tmp_path, k, grain, lengths):
    """Both merges make the same file, byte for byte; tcpdump reads it in time order, every record once, the
    records a CPU published out of order where their time puts them."""
    _fast()
    per = _workload(k, 60 if k <= 16 else 12, grain, seed=k, lengths=lengths)
    a, b = tmp_path / "numpy.pcap", tmp_path / "runs.pcap"
    # rings of 4 KiB: 4 passes wrap every CPU's ring and index
    assert _drain(per, True, 4096, a, passes=4) == _drain(per, False, 4096, b, passes=4) == sum(map(len, per))
    assert a.read_bytes() == b.read_bytes()
    got = _tcpdump_seqs(a)
    assert sorted(seq for _ts, seq in got) == sorted(seq for recs in per for _ts, seq, _r in recs)
    times = [ts for ts, _seq in got]
    assert times == sorted(times)


@pytest.mark.parametrize("limit", [1, 7, 100])
def test_count_keeps_the_first_by_time_through_either_merge(tmp_path, limit):
    _fast()
    per = _workload(16, 20, 1, seed=limit)
    a, b = tmp_path / "numpy.pcap", tmp_path / "runs.pcap"
    assert _drain(per, True, 1 << 14, a, passes=2, limit=limit) == limit
    assert _drain(per, False, 1 << 14, b, passes=2, limit=limit) == limit
    assert a.read_bytes() == b.read_bytes()
    got = [seq for _ts, seq in _tcpdump_seqs(a)]
    first = sorted((ts, seq) for recs in per for ts, seq, _r in recs[:len(recs) // 2])[:limit]
    assert got == [seq for _ts, seq in first]


@pytest.mark.parametrize("lengths", [1, 3, 40])
@pytest.mark.parametrize("limit", [-1, 25])
def test_records_in_several_memories_merge_by_time(lengths, limit):
    """Records in several memories (the file rings' mapping and the perf rings' records laid out elsewhere, as a
    capture without skb dynptrs has them: fcap.live.fastmerge.plan_with) come out in time order, each source's as a
    prefix, copied into one buffer or (many lengths) as (address, length) pairs."""
    import ctypes
    fast = _fast()
    np = fast.np
    rnd = random.Random(lengths * 100 + limit)
    memories, recs = [], []   # recs: (ts, source, offset, bytes), each source's in time order
    for j in range(3):
        blob, ts = b"", 0
        for _ in range(30):
            ts += rnd.randrange(1, 50)
            rec = os.urandom(8 + rnd.randrange(lengths))
            recs.append((ts, j, len(blob), rec))
            blob += rec
        memories.append(np.frombuffer(blob, np.uint8).copy())
    ts, src, at, size = (np.array(col, np.uint64 if i != 1 else np.int64) for i, col in
                         enumerate(zip(*[(t, j, o, len(r)) for t, j, o, r in recs])))
    p = fast.chosen(ts, at, size, np.array([30, 30, 30], np.int64), limit, 0, memories, src)
    want = sorted(recs, key=lambda r: (r[0], r[1]))[:limit if limit >= 0 else None]
    if p.data is not None:
        got = bytes(p.data)
    else:
        assert lengths == 40, "a few lengths: one buffer"
        got = b"".join(ctypes.string_at(int(a), int(n)) for a, n in p.iov)
    assert got == b"".join(r[3] for r in want)
    assert p.takes == [sum(1 for r in want if r[1] == j) for j in range(3)]
    assert p.count == len(want) and p.oldest == want[0][0] and p.newest == want[-1][0]


def _records(n: int, seed: int = 1):
    """n records of random sizes in memory, and their (address, length) pairs in a shuffled order."""
    import numpy as np
    rnd = random.Random(seed)
    data = [struct.pack("=IIII", i, 0, s, s) + os.urandom(s) for i, s in
            ((i, rnd.randrange(0, 3000)) for i in range(n))]
    blob = np.frombuffer(b"".join(data), np.uint8).copy()
    starts = np.cumsum([0] + [len(d) for d in data[:-1]])
    order_ = list(range(n))
    rnd.shuffle(order_)
    iov = np.array([[blob.ctypes.data + int(starts[i]), len(data[i])] for i in order_], np.uint64)
    return blob, iov, b"".join(data[i] for i in order_)


def test_iovec_writes_through_a_slow_pipe_and_stops_at_a_broken_one():
    """A pipe whose slow reader leaves the writer blocked, a timer's signal interrupting it (writev returns short,
    in the middle of a record): every byte arrives, in order. A reader that has left: BrokenPipeError, as
    os.writev raises it, with the bytes that went."""
    import signal
    import time
    _fast()
    from fcap.files import iovec
    blob, iov, want = _records(3000)
    r, w = os.pipe()
    got = bytearray()
    interrupted = []

    def read():
        while chunk := os.read(r, 5000):
            got.extend(chunk)
            time.sleep(0.0005)
    t = threading.Thread(target=read)
    t.start()
    old = signal.signal(signal.SIGALRM, lambda *a: interrupted.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    try:
        assert iovec.write_all(w, iov) == len(want)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.close(w)
        t.join()
        os.close(r)
    assert interrupted and bytes(got) == want
    r, w = os.pipe()
    os.close(r)
    try:
        with pytest.raises(BrokenPipeError) as e:
            iovec.write_all(w, iov)
        assert e.value.written == 0
    finally:
        os.close(w)
    del blob


def test_a_full_file_keeps_whole_records(tmp_path):
    """A file system that fills up in the middle of a batch: the file ends with the last whole record (as the
    writev path's)."""
    _fast()
    root_only = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs",
                                                      str(tmp_path)], capture_output=True).returncode == 0
    if not root_only:
        pytest.skip("cannot mount a small tmpfs here (root needed)")
    try:
        blob, iov, want = _records(400, seed=3)
        path = tmp_path / "full.pcap"
        with open(path, "wb") as f:
            w = PcapWriter(f, linktype=1, snaplen=262144)
            with pytest.raises(OSError):
                w.write_iov(iov)
            w._file.close()
        data = path.read_bytes()[24:]
        from fcap.files.pcapfile import whole_records
        assert 0 < len(data) < len(want) and whole_records("pcap", data) == len(data)
        assert want.startswith(data)
        del blob
    finally:
        subprocess.run(["umount", str(tmp_path)], check=False)


def test_rotation_cuts_records_where_writev_cuts_them(tmp_path):
    """-C through write_iov: the same files, with the same records, as through writev."""
    _fast()
    from fcap.files.rotate import RotatingWriter, RotationPlan
    blob, iov, want = _records(300, seed=5)
    parts = []
    at = 0
    for _addr, n in iov.tolist():
        parts.append(want[at:at + n])
        at += n
    made = {}
    for how in ("writev", "iov"):
        d = tmp_path / how
        d.mkdir()
        rw = RotatingWriter(str(d / "x.pcap"), RotationPlan(size=100_000), "pcap",
                            lambda f: PcapWriter(f, linktype=1, snaplen=262144))
        for lo in range(0, len(parts), 40):   # batches as the drain's passes would give them
            if how == "writev":
                rw.writev(parts[lo:lo + 40])
            else:
                rw.write_iov(iov[lo:lo + 40])
        rw.close()
        made[how] = {os.path.basename(p): open(p, "rb").read() for p in rw.paths}
    assert len(made["iov"]) > 3 and made["iov"] == made["writev"]
    del blob
