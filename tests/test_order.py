"""Every record in time order (live.order): `-c N` keeps the first N packets by time and files are in time order, on
every path (file rings, perf buffer, printing, the Python API), with TCP client and server on different CPUs.
Held to tcpdump -i lo on the same traffic at tp_btf/net_dev_start_xmit, the point that sees what its tap sees."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import need_root

from netns import SLOW, read_packets, softnet_drops, start_fcap, start_tcpdump, stop_helper

POINT = "tp_btf/net_dev_start_xmit"
ROUNDS = 30            # request/response rounds of the ping-pong traffic: 2 packets each (ACKs ride along)
BULK = 4 << 20         # bytes of the bulk transfer (each way)

# A TCP server on one CPU and a client on the other (or both on one): the server listens and prints its port,
# then on a line from the test the client connects and runs "pingpong ROUNDS" (each request waits for its reply:
# every packet follows from the one before, so any tool sees them in one order), "get N" (a request, N bytes back:
# as HTTP) or "bulk N" (N bytes each way at once).
TRAFFIC = r"""
import os, socket, sys, threading
cpus = sorted(os.sched_getaffinity(0))
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
mode, n, same = sys.stdin.readline().split(); n = int(n)
def pin(i):
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[0 if same == "1" else i % len(cpus)]})
def recv_all(s, k):
    got = 0
    while got < k:
        d = s.recv(min(1 << 20, k - got))
        if not d:
            raise SystemExit("short read")
        got += len(d)
def serve():
    pin(1)
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if mode == "pingpong":
        for i in range(n):
            recv_all(c, 100); c.sendall(bytes([i % 256]) * 300)
    elif mode == "get":
        recv_all(c, 100); c.sendall(b"g" * n)
    else:
        w = threading.Thread(target=c.sendall, args=(b"s" * n,)); w.start(); recv_all(c, n); w.join()
    c.close()
t = threading.Thread(target=serve); t.start()
pin(0)
c = socket.create_connection(("127.0.0.1", srv.getsockname()[1]))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if mode == "pingpong":
    for i in range(n):
        c.sendall(bytes([i % 256]) * 100); recv_all(c, 300)
elif mode == "get":
    c.sendall(b"G" * 100); recv_all(c, n)
else:
    w = threading.Thread(target=c.sendall, args=(b"c" * n,)); w.start(); recv_all(c, n); w.join()
t.join(); c.close()
print("done", flush=True)
"""


class Traffic:
    """The helper above: .port once it listens; run(mode, n) makes the traffic and waits for its end."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", TRAFFIC], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def run(self, mode: str, n: int, one_cpu: bool = False) -> None:
        self.proc.stdin.write(f"{mode} {n} {int(one_cpu)}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line.strip() == "done", f"traffic failed: {line!r} {self.proc.stderr.read()}"

    def close(self) -> None:
        stop_helper(self.proc)


@pytest.fixture
def traffic(root):
    t = Traffic()
    yield t
    t.close()


def _key(p) -> tuple:
    """A TCP segment as both tools see it: ports, seq, ack, flags, payload length (IPv4 from the network header)."""
    return _key_l3(p.l3)


def _key_l3(ip: bytes) -> tuple:
    ihl = (ip[0] & 15) * 4
    tcp = ip[ihl:]
    total = int.from_bytes(ip[2:4], "big")
    return (tcp[0:2].hex(), tcp[2:4].hex(), tcp[4:8].hex(), tcp[8:12].hex(), tcp[13], total - ihl - (tcp[12] >> 4) * 4)


def _capture(tmp_path, traffic, mode: str, n: int, fcap_args: list[str], fmt: str = "pcap", td_extra=(),
             one_cpu: bool = False):
    """tcpdump -i lo and fcap at POINT on the traffic's port, both listening before it begins; returns (tcpdump's
    packets, fcap's Proc, fcap's file)."""
    flt = f"tcp port {traffic.port}"
    td_path, fc_path = tmp_path / "td.pcap", tmp_path / f"fc.{fmt}"
    backlog = softnet_drops()
    td = start_tcpdump("lo", td_path, *td_extra, flt)
    try:
        fc = start_fcap(["-i", POINT, "-w", str(fc_path), *fcap_args, flt])
        try:
            traffic.run(mode, n, one_cpu)
            if "-c" in fcap_args:
                assert fc.wait() == 0, fc.stderr
            else:
                assert fc.stop() == 0, fc.stderr
        finally:
            fc.kill()
    finally:
        td.stop()
        td.kill()
    assert "0 packets dropped by kernel" in td.stderr, td.stderr
    fc.backlog_drops = softnet_drops() - backlog   # packets fcap saw sent that tcpdump's receive tap never saw
    return read_packets(td_path), fc, fc_path


def assert_first_n(ours: list, theirs: list, n: int, pure_ack) -> None:
    """`ours` (fcap's first n, as keys or lines) are tcpdump's first n in tcpdump's order (`theirs`: its whole
    capture), except that a pure ACK (`pure_ack(item)`) may have changed places with a neighbour. In the ping-pong
    every segment with data follows from the one before, so both tools see those in one order; a pure ACK does not:
    tcpdump takes lo's packets at receive (libpcap skips lo's outgoing copies) and fcap at transmit, and the ACK the
    receiving CPU sends from its softirq can reach its receive before or after the next request, sent from the
    other CPU, reaches that one's."""
    assert len(ours) == n, f"{len(ours)} packets, not {n}"
    i = 0
    while i < n:
        if ours[i] != theirs[i]:
            swapped = (i + 1 < len(theirs) and ours[i] == theirs[i + 1] and (i + 1 == n or ours[i + 1] == theirs[i])
                       and (pure_ack(theirs[i]) or pure_ack(theirs[i + 1])))
            assert swapped, f"packet {i}: fcap {ours[i]}, tcpdump {theirs[i]}\nfcap {ours}\ntcpdump {theirs[:n + 1]}"
            i += 1
        i += 1


def _no_data(key: tuple) -> bool:
    return key[5] == 0


# (--no-skb-dynptr: as on kernels before 6.12, TCP's data through the perf buffer, the ACKs through the file rings)
PATHS = [pytest.param([], id="file-rings"), pytest.param(["--perf-buffer"], id="perf-buffer"),
         pytest.param(["--no-skb-dynptr"], id="no-skb-dynptr")]


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("count", [1, 20])
def test_count_keeps_the_first_packets(tmp_path, traffic, fmt, path, count):
    """-c N: fcap's file holds exactly tcpdump's first N packets of the traffic, in tcpdump's order."""
    theirs, fc, fc_path = _capture(tmp_path, traffic, "pingpong", ROUNDS, [*path, "-c", str(count)], fmt)
    ours = read_packets(fc_path)
    assert len(theirs) >= 2 * ROUNDS
    assert_first_n([_key(p) for p in ours], [_key(p) for p in theirs], count, _no_data)
    assert f"{count} packet{'s' if count > 1 else ''} captured" in fc.stderr


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("path", PATHS)
def test_files_are_in_time_order(tmp_path, traffic, fmt, path):
    """A bulk transfer each way at once, client and server on different CPUs: fcap's file is in time order and
    holds the packets tcpdump holds."""
    theirs, fc, fc_path = _capture(tmp_path, traffic, "bulk", BULK // int(SLOW), [*path, "-B", "65536"], fmt,
                                   ("-B", "65536"))
    ours = read_packets(fc_path)
    assert "0 packets dropped by kernel" in fc.stderr, fc.stderr
    ts = [p.ts_ns for p in ours]
    late = [i for i in range(1, len(ts)) if ts[i] < ts[i - 1]]
    assert not late, f"{len(late)} of {len(ts)} records older than the one before (first at {late[0]})"
    if not fc.backlog_drops:
        assert sorted(_key(p) for p in ours) == sorted(_key(p) for p in theirs)


def _analysis_flags(tshark: str, path) -> list[str]:
    r = subprocess.run([tshark, "-n", "-r", str(path), "-Y", "tcp.analysis.flags", "-T", "fields", "-e",
                        "tcp.seq_raw", "-e", "tcp.ack_raw", "-e", "_ws.expert.message"],
                       capture_output=True, text=True, timeout=120 * SLOW)
    assert r.returncode == 0, r.stderr
    # (the expert messages without the packet comments fcap's pcapng carries)
    return sorted("\t".join(f if i < 2 else ",".join(m for m in f.split(",") if not m.startswith("skb="))
                            for i, f in enumerate(line.split("\t"))) for line in r.stdout.splitlines())


# What Wireshark's TCP analysis says when a capture's order is wrong: a packet before one sent earlier, an ACK before
# the data it acknowledges
ORDER_FLAGS = ("out-of-order", "not captured", "unseen", "retransmission", "Dup ACK")


@pytest.mark.parametrize("cpus", ["one", "two"])
@pytest.mark.parametrize("path", PATHS)
def test_tcp_analysis_as_on_tcpdumps_capture(tmp_path, traffic, tshark, path, cpus):
    """Wireshark's TCP analysis of fcap's capture of a transfer (a request, megabytes back) against tcpdump's of
    the same. On one CPU the two files are in one order: the analysis must say the same. On two, tcpdump's time is
    taken at receive on lo (libpcap skips lo's outgoing copies), fcap's at transmit, so packets sent on both CPUs
    within microseconds may be in the other order in either file (seen: tcpdump's with segments out of order,
    fcap's with one more 'window full'): nothing fcap's says about order may be missing from tcpdump's."""
    theirs, fc, fc_path = _capture(tmp_path, traffic, "get", BULK // int(SLOW), [*path, "-B", "65536"], "pcapng",
                                   ("-B", "65536"), one_cpu=cpus == "one")
    assert "0 packets dropped by kernel" in fc.stderr, fc.stderr
    if fc.backlog_drops:   # (sent, so at fcap's point, but dropped before tcpdump's tap on lo: not the same packets)
        pytest.skip(f"the kernel dropped {fc.backlog_drops} packets at its input backlog during the transfer")
    ours, want = _analysis_flags(tshark, fc_path), _analysis_flags(tshark, tmp_path / "td.pcap")
    if cpus == "one":
        assert ours == want
    else:
        assert {f for f in ours if any(k in f for k in ORDER_FLAGS)} <= set(want)


def test_printed_count_is_the_first_packets(tmp_path, traffic, tcpdump):
    """Printing, -c N: the first N packets by time, printed as tcpdump prints its own capture's first N."""
    flt = f"tcp port {traffic.port}"
    td_path = tmp_path / "td.pcap"
    td = start_tcpdump("lo", td_path, flt)
    try:
        fc = start_fcap(["-i", POINT, "-t", "-S", "-c", "20", flt], stdout=subprocess.PIPE)
        try:
            traffic.run("pingpong", ROUNDS)
            assert fc.wait() == 0, fc.stderr
            lines = fc.p.stdout.read().decode().splitlines()
        finally:
            fc.kill()
    finally:
        td.stop()
        td.kill()
    r = subprocess.run(["tcpdump", "-nn", "-t", "-S", "-r", str(td_path)], capture_output=True, text=True,
                       timeout=60)
    assert_first_n(lines, r.stdout.splitlines(), 20, lambda line: line.endswith(", length 0"))


def test_api_count_is_the_first_packets(tmp_path, traffic, tcpdump):
    """fcap.capture(count=N) yields the first N packets by time."""
    import fcap
    need_root()
    flt = f"tcp port {traffic.port}"
    td_path = tmp_path / "td.pcap"
    td = start_tcpdump("lo", td_path, flt)
    try:
        with fcap.capture(POINT, filter=flt, count=20) as cap:
            traffic.run("pingpong", ROUNDS)
            got = [bytes(p.data) for p in cap]
    finally:
        td.stop()
        td.kill()
    theirs = [p.raw for p in read_packets(td_path)]
    assert set(got) <= set(theirs), "a packet tcpdump did not see, or not as it saw it"
    assert_first_n([_key_l3(f[14:]) for f in got], [_key_l3(f[14:]) for f in theirs], 20, _no_data)


def test_window_merges_by_runs():
    """fcap.live.order's merge: runs across batches, ties to the earlier batch, a limit, unsorted batches by record."""
    from fcap.live import order
    a, b = [1, 2, 3, 10, 11], [4, 5, 12]
    yes = [True, True]
    assert order.runs([a, b], [5, 3], yes) == [(0, 0, 3), (1, 0, 2), (0, 3, 5), (1, 2, 3)]
    assert order.runs([a, b], [5, 3], yes, 4) == [(0, 0, 3), (1, 0, 1)]
    assert order.runs([a, b], [2, 3], yes) == [(0, 0, 2), (1, 0, 3)]
    assert order.runs([[3, 1], [2]], [2, 1], [False, True]) == [(0, 1, 2), (1, 0, 1), (0, 0, 1)]
    assert order.eligible(a, 10, True) == 3 and order.eligible([1, 9, 2], 5, False) == 1
    assert not order.is_sorted([1, 9, 2]) and order.is_sorted(a)
    w = order.Window(1000)
    w.wrote(2, 50)
    assert w.margin == 2000 and w.late == 2 and w.last == 50
    runs, takes = order.merge(w, [[10, 60], [40]], yes, 55)   # 10 and 40 go, both late (before 50)
    assert runs == [(0, 0, 1), (1, 0, 1)] and takes == [1, 1] and w.late == 4 and w.last == 50 and w.lag == 40
    w.wrote(1, 9000, 50 - 7000)   # (what the summary and the pcapng statistics say: how many, how late at most)
    assert w.disorder() == "5 packets written out of time order (late), up to 7 us" and w.lag == 7000
    assert order.Window().disorder() == ""


def test_pending_holds_records_past_the_cutoff():
    from fcap.live import order
    class R:
        def __init__(self, ts):
            self.ts_ns = ts
    p = order.Pending(order.Window(0))
    got = p.take([R(5), R(1), R(9)], 6)
    assert [r.ts_ns for r in got] == [1, 5] and len(p.held) == 1
    got = p.take([R(7)], order.FINAL)
    assert [r.ts_ns for r in got] == [7, 9]
    got = p.take([R(3)], order.FINAL)   # late: older than what was delivered
    assert [r.ts_ns for r in got] == [3] and p.window.late == 1


def test_count_waits_for_every_program_before_it_takes_the_oldest():
    """-c: once the records at hand would complete it, a pass delivers none (the capture detaches); the last pass
    delivers the oldest, one published after the others among them (its program held between its clock read and
    its publish)."""
    from fcap.live import order

    class R:
        def __init__(self, ts):
            self.ts_ns = ts
    p = order.Pending(order.Window(0))
    assert [r.ts_ns for r in p.take([R(1), R(4)], 100, left=3)] == [1, 4] and not p.reached
    assert p.take([R(9), R(7)], 100, left=1) == [] and p.reached
    assert [r.ts_ns for r in p.take([R(5)], order.FINAL, left=1)] == [5] and [r.ts_ns for r in p.held] == [7, 9]
    assert not order.reached(5, 0) and not order.reached(2, 3) and order.reached(3, 3)


class _Sink:
    fmt = "pcap"

    def __init__(self):
        self.out = bytearray()

    def writev(self, parts):
        for p in parts:
            self.out += bytes(p)

    def write_iov(self, iov):
        from fcap.files import iovec
        self.out += iovec.gather(iov)


def _rings():
    """Two CPUs' 256-byte file rings (8 index entries), filled as the programs fill them (bench.replay)."""
    from bench.replay import ReplayRings
    return ReplayRings(2, 256)


@pytest.mark.parametrize("fast", [True, False], ids=["numpy", "runs"])
def test_ring_drain_merges_holds_and_counts(fast):
    """RingDrain over rings filled as the programs fill them: two CPUs merged by time (by numpy's argsort, and by
    runs), the ring's bytes and its index wrapping, a record past the cutoff held until the last pass, a CPU whose
    records came out of order merged record by record, a late record, and -c's limit (the oldest, one published
    last among them)."""
    import time

    from bench.replay import Doorbells
    from fcap.live.drain import FAST
    from fcap.live.ringdrain import RingDrain
    if fast and FAST.wait() is None:
        pytest.skip(f"numpy's merge: {FAST.missing}")
    rings, sink = _rings(), _Sink()
    d = RingDrain(rings, rings.ring_size, Doorbells(), sink, fast=fast)
    t = time.monotonic_ns() - 10**9
    want = []
    for rnd in range(5):   # 5 rounds of 4 records per CPU: the 8-entry index and the 256-byte ring wrap
        for k in range(4):
            for cpu in (0, 1):
                ts = t + rnd * 100 + k * 10 + cpu * 5
                data = b"%d:%d:%02d|" % (cpu, rnd, k) + bytes(7 * cpu + k)
                assert rings.publish(cpu, ts, data)
                want.append((ts, data))
        assert d() == 8
    assert bytes(sink.out) == b"".join(data for _ts, data in sorted(want))
    sink.out.clear()
    future = time.monotonic_ns() + 10**10
    rings.publish(0, future, b"later|")
    rings.publish(1, t + 1000, b"now|")
    assert d() == 1 and bytes(sink.out) == b"now|" and d() == 0
    rings.publish(1, t + 2000, b"then|")
    rings.publish(1, t + 1500, b"before|")   # out of order on CPU 1: counted by the program, merged one by one
    assert d(final=True) == 3 and bytes(sink.out) == b"now|before|then|later|"
    assert d.window.late == 0 and d.written == 44
    rings.publish(1, t + 1700, b"late|")   # older than what was written: written anyway, counted, margin doubled
    assert d() == 1 and sink.out.endswith(b"later|late|") and d.window.late == 1 and d.window.margin == 4_000_000
    assert d.window.lag == future - (t + 1700)
    d.close()
    rings.close()
    rings, sink = _rings(), _Sink()
    d = RingDrain(rings, rings.ring_size, Doorbells(), sink, limit=3, fast=fast)
    for i, cpu in enumerate((1, 0, 1, 0, 1)):
        rings.publish(cpu, t + 10 + i, b"%d|" % i)
    assert d() == 0 and d.reached and not d.done   # (-c within reach: the capture detaches first)
    rings.publish(0, t + 5, b"held|")   # its program read the time first: it is among the oldest
    assert d(final=True) == 3 and d.done and bytes(sink.out) == b"held|0|1|"
    # (CPU 0's records out of order: its "3|" went with the prefix taken, not written; still counted as published)
    assert d.written == 3 and d.published() == 6
    d.close()
    rings.close()


class _FakePerfRing:
    """One CPU's perf ring in user memory, with the records a capture program's perf samples make."""

    def __init__(self, size: int = 1024):
        import ctypes
        self.size, self.mask = size, size - 1
        self.mem = (ctypes.c_char * size)()
        self.data = memoryview(self.mem).cast("B")
        self.head = self.tail = 0

    def address(self) -> int:
        import ctypes
        return ctypes.addressof(self.mem)

    def span(self):
        return self.tail, self.head

    def release(self, tail: int) -> None:
        assert self.head >= tail >= self.tail
        self.tail = tail

    def _put(self, rec: bytes) -> None:
        assert self.head + len(rec) - self.tail <= self.size
        for k, b in enumerate(rec):
            self.data[(self.head + k) & self.mask] = b
        self.head += len(rec)

    def sample(self, ts: int, payload: bytes, lead: bytes = b"", **meta) -> None:
        """A sample as the programs write it: `lead` (--dump's area), META, the packet's bytes."""
        import struct as st

        from fcap.kernel.layout import META
        fields = dict.fromkeys(META.Tuple._fields, 0)
        fields.update(ts=ts, comm=b"", fast=len(payload), caplen=len(payload), orig=len(payload), copy=len(payload),
                      **meta)
        raw = lead + META.struct.pack(*fields.values()) + payload
        raw += bytes(-(len(raw) + 4) % 8)
        self._put(st.pack("<IHHI", 9, 0, 12 + len(raw), len(raw)) + raw)   # PERF_RECORD_SAMPLE

    def lost(self, n: int) -> None:
        import struct as st
        self._put(st.pack("<IHHQQ", 2, 0, 24, 0, n))   # PERF_RECORD_LOST: id, lost


class _FakePerf:
    def __init__(self, n: int):
        self.rings = [_FakePerfRing() for _ in range(n)]
        self.lost = 0


def _payloads(sink) -> bytes:
    """The packets' bytes of the pcap records a FileDrain wrote (each after its 16-byte header)."""
    out, k, data = b"", 0, bytes(sink.out)
    while k < len(data):
        caplen = int.from_bytes(data[k + 8:k + 12], "little")
        out += data[k + 16:k + 16 + caplen]
        k += 16 + caplen
    return out


@pytest.mark.parametrize("fast", [True, False], ids=["arrays", "python"])
def test_perf_drain_merges_holds_and_counts_lost(fast):
    """FileDrain over perf rings: two CPUs merged by time, a record past the cutoff left in its ring (the tail
    stops before it, LOST records after it counted once), records that wrap the ring's end, and -c; through
    fcap.live.perfwalk's arrays and through the Python walk."""
    import time

    from fcap.live.drain import FAST, FileDrain
    if fast and FAST.wait() is None:
        pytest.skip(f"numpy: {FAST.missing}")
    buf, sink = _FakePerf(2), _Sink()
    d = FileDrain(buf, sink, fast=fast)
    t = time.monotonic_ns() - 10**9
    a, b = buf.rings
    a.sample(t + 10, b"a10|")
    b.sample(t + 5, b"b5|")
    a.sample(t + 20, b"a20|")
    b.sample(t + 15, b"b15|")
    b.lost(2)
    assert d() == 4 and _payloads(sink) == b"b5|a10|b15|a20|" and buf.lost == 2
    sink.out.clear()
    a.sample(time.monotonic_ns() + 10**10, b"later|")
    a.lost(3)
    b.sample(t + 30, b"b30|")
    assert d() == 1 and _payloads(sink) == b"b30|" and buf.lost == 2 and a.tail < a.head
    for i in range(12):   # past the 1 KiB ring's end
        b.sample(t + 40 + i, b"b%02d|" % i)
        assert d() == 1
    assert buf.lost == 2
    assert d(final=True) == 1 and _payloads(sink).endswith(b"b11|later|") and buf.lost == 5 and a.tail == a.head
    assert d.written == 18 and d.window.late == 0
    buf, sink = _FakePerf(2), _Sink()
    d = FileDrain(buf, sink, limit=2, fast=fast)
    for i, r in enumerate((buf.rings[1], buf.rings[0], buf.rings[1])):
        r.sample(t + 10 + i, b"%d|" % i)
    assert d() == 0 and d.reached and not d.done   # (-c within reach: the capture detaches first)
    buf.rings[0].sample(t + 5, b"held|")
    assert d(final=True) == 2 and d.done and _payloads(sink) == b"held|0|"
