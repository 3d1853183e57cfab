"""The file rings (fcap.kernel.ringrec), where the capture program writes finished pcap/pcapng records itself, against
the perf buffer path (FileDrain, which fcap takes with --perf-buffer): the same packets, the same bytes, the same
metadata comment, the same block layout as the writer's; exact counts when the ring wraps and overflows."""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import time

import pytest
from conftest import need_root

from netns import UDPSink, ping, start_fcap
from packets import summary

POINT = "tp_btf/net_dev_queue"
PR_SET_NAME = 15


def _ring_available() -> None:
    need_root()
    from fcap.points import pointcaps
    from fcap.live.session import Config, Session
    s = Session(Config(points=[POINT]))
    s.resolve()
    if not pointcaps.dynptr_kfunc(s.points[0]):
        pytest.skip("this kernel has no skb dynptr in tracing programs: records go through the perf buffer")


def _traffic(tag: bytes) -> int:
    """Datagrams tagged with `tag` of many sizes, some from a task with a 15-character comm and a mark, plus
    pings; returns how many tagged datagrams were sent."""
    n = 0
    with UDPSink() as sink:
        for mark, name in ((0, None), (0x1F3, b"fcap-ring-test1"), (7, b"x")):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            if mark:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, 6)
            libc = ctypes.CDLL(None, use_errno=True)
            old = ctypes.create_string_buffer(16)
            libc.prctl(16, old)   # PR_GET_NAME
            if name:
                libc.prctl(PR_SET_NAME, ctypes.c_char_p(name))
            try:
                for size in (0, 1, 2, 3, 5, 63, 64, 65, 99, 100, 101, 1000, 1471, 1472, 3000, 9000):
                    s.sendto(tag + struct.pack("!I", n) + b"\x5a" * size, ("127.0.0.1", sink.port))
                    n += 1
            finally:
                libc.prctl(PR_SET_NAME, old)
                s.close()
    ping("127.0.0.1", count=2, interval=0.05)
    return n


def _packets(path: str, tag: bytes) -> dict:
    from fcap.files.pcapread import read
    # (two captures make their own packet ids: the skb address in the comment pairs their records)
    return {(r.comment.split(" ", 1)[0], bytes(r.data)): r for r in read(path) if tag in r.data}


@pytest.mark.parametrize("fmt", ["pcapng", "pcap"])
@pytest.mark.parametrize("snaplen", ["100", "0"])
def test_ring_matches_perf_path(tmp_path, fmt, snaplen):
    _ring_available()
    tag = os.urandom(8)
    ring, perf = str(tmp_path / f"ring.{fmt}"), str(tmp_path / f"perf.{fmt}")
    a = start_fcap(["-i", POINT, "-s", snaplen, "-w", ring])
    b = start_fcap(["-i", POINT, "-s", snaplen, "--perf-buffer", "-w", perf])
    try:
        sent = _traffic(tag)
        time.sleep(0.3)
    finally:
        for p in (a, b):
            p.stop()
    assert a.p.returncode == 0 and b.p.returncode == 0, a.stderr + b.stderr
    if fmt == "pcap":   # no packet ids in pcap: match on the bytes (each datagram's are unique)
        from fcap.files.pcapread import read
        ours = sorted((bytes(r.data), r.orig_len) for r in read(ring) if tag in r.data)
        theirs = sorted((bytes(r.data), r.orig_len) for r in read(perf) if tag in r.data)
        assert len(ours) == sent and ours == theirs
        return
    ours, theirs = _packets(ring, tag), _packets(perf, tag)
    assert len(ours) == sent, f"ring path: {len(ours)} of {sent} tagged datagrams"
    assert ours.keys() == theirs.keys()
    for k, r in ours.items():
        t = theirs[k]
        assert (r.orig_len, r.flags, r.comment, r.iface, r.queue, r.verdict) == \
            (t.orig_len, t.flags, t.comment, t.iface, t.queue, t.verdict), k
        assert r.queue == 0 and r.verdict is None     # lo's one transmit queue; not a drop point
        assert abs(r.ts_ns - t.ts_ns) < 50_000_000
    comments = {r.comment.split(" len=")[0].split(" comm=")[1] for r in ours.values()}
    assert {"fcap-ring-test1 ifindex=1 mark=0x1f3 priority=6", "x ifindex=1 mark=0x7 priority=6"} <= {
        c.split(" netns=")[0] for c in comments}


def test_ring_pcapng_blocks_as_the_writer_makes_them(tmp_path):
    """Every block the program laid out is byte for byte what PcapngWriter.write makes of the same record."""
    _ring_available()
    from fcap.files.pcapfile import PcapngWriter
    from fcap.files.pcapread import read
    path = str(tmp_path / "ring.pcapng")
    a = start_fcap(["-i", POINT, "-s", "200", "-w", path])
    try:
        _traffic(os.urandom(8))
        time.sleep(0.3)
    finally:
        a.stop()
    records = list(read(path))
    assert records
    import io
    buf = io.BytesIO()
    w = PcapngWriter(buf, closefd=False)
    with open(path, "rb") as f:
        data = f.read()
    # skip our SHB and IDB (the file's own): compare the blocks after them
    off = 0
    for _ in range(2):
        off += struct.unpack_from("=I", data, off + 4)[0]
    w.add_interface(POINT, records[0].linktype, 200)
    start = len(buf.getvalue())
    for r in records:
        w.write(r.ts_ns, r.data, r.orig_len, iface=r.iface, flags=r.flags, comment=r.comment, packet_id=r.packet_id,
                queue=r.queue, verdict=r.verdict)
    # the packets' blocks, then the point's statistics (an Interface Statistics Block, type 5) at the end
    end = off
    while end < len(data) and struct.unpack_from("=I", data, end)[0] != 5:
        end += struct.unpack_from("=I", data, end + 4)[0]
    assert buf.getvalue()[start:] == data[off:end]
    assert struct.unpack_from("=II", data, end) == (5, len(data) - end), "not one ISB after the packets"


@pytest.mark.parametrize("fmt, snap", [("pcapng", "0"), ("pcap", "14")])
def test_ring_wraps_and_counts_exactly(tmp_path, fmt, snap):
    """A 64 KiB ring per CPU (-B 128 on two CPUs) wraps many times and overflows: every record in the file is
    whole, in time order, and captured + dropped == received, captured == records in the file. With 30-byte
    records (-s 14) its index (one entry per 32 bytes) fills before its bytes do."""
    _ring_available()
    from fcap.files.pcapread import read
    path = str(tmp_path / f"small.{fmt}")
    a = start_fcap(["-i", POINT, "-B", "128", "-s", snap, "-w", path])
    tag = os.urandom(8)
    try:
        with UDPSink() as sink:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for i in range(20000):
                s.sendto(tag + struct.pack("!I", i) + b"\x33" * (i % 1400), ("127.0.0.1", sink.port))
            s.close()
        time.sleep(0.3)
    finally:
        a.stop()
    assert a.p.returncode == 0, a.stderr
    n = summary(a.stderr)
    records = list(read(path))
    assert n["captured"] == len(records)
    assert n["captured"] + n["dropped by kernel"] == n["received by filter"]
    ts = [r.ts_ns for r in records]
    assert ts == sorted(ts)
    if snap == "14":
        assert len(records) > 1000 and all(len(r.data) <= 14 for r in records)
        return
    seqs = [struct.unpack("!I", r.data[50:54])[0] for r in records if r.data[42:50] == tag]
    assert len(seqs) == len(set(seqs)) and len(seqs) > 1000


@pytest.mark.parametrize("fmt", ["pcapng", "pcap"])
def test_ring_counts_a_record_older_than_the_one_before(fmt):
    """A record older than the one published before it on its CPU (the program interrupted another point's before
    that one took the ring) is counted in the ring's disorder word, which makes RingDrain merge that CPU's records
    one by one. A `last` set in the future stands in for the other point's record: each CPU's first record is
    counted, the rest (in order) are not."""
    _ring_available()
    from fcap.kernel.layout import HEAD_BITS, RING
    from fcap.live.session import Config, Session
    with UDPSink() as sink:
        s = Session(Config(points=[POINT], filter=f"udp and dst port {sink.port}", record=fmt, file_ring=True,
                           meta=fmt == "pcapng"))
        try:
            s.resolve()
            s.open()
            assert s.ring is not None
            mm = s.ring.mmap()
            words = memoryview(mm).cast("Q")
            bases = [i * s.ring.stride // 8 for i in range(s.ring.max_entries)]
            for b in bases:
                words[b + RING.off("last") // 8] = 1 << 62
            s.attach()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                for i in range(5):
                    sock.sendto(b"fcap-disorder%d" % i, ("127.0.0.1", sink.port))
            records = {b: words[b + RING.off("head") // 8] >> HEAD_BITS for b in bases}
            disorder = {b: words[b + RING.off("disorder") // 8] for b in bases}
            del words
            mm.close()
        finally:
            s.close()
    assert sum(records.values()) == 5
    assert disorder == {b: int(n > 0) for b, n in records.items()}
