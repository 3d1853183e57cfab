"""Packet ids and --track, against the kernel's own view: traffic that recycles skbs (a veth pair into a namespace,
UDP to a port whose socket reads, to a closed port the filter leaves out, TCP), every datagram tagged in its
payload so that the bytes say which packet a record is.

- --track never captures a packet it did not start on (the ports say), each id's records are one packet (the
  tags say), and the summary's counts are the packets'.
- Without --track, several points: one id per packet, the same at each point (tshark's frame.packet_id).
- Where tracefs is mounted (the host): every id's records fall in one life of their skb, the lives as the kernel's
  allocator and free tracepoints say (kmem_cache_alloc/free of the skb, kfree_skb, consume_skb)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from netns import SLOW, flow_of, read_packets, start_fcap, stop_helper
from tsharkutil import tshark_rows

N = 20
READER = r"""
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((sys.argv[1], 0))
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); t.bind((sys.argv[1], 0)); t.listen(4)
import threading
def tcp():
    while True:
        c, _ = t.accept()
        while c.recv(65536):
            pass
        c.close()
threading.Thread(target=tcp, daemon=True).start()
print(u.getsockname()[1], t.getsockname()[1], flush=True)
while True:
    u.recv(65536)
"""


@contextlib.contextmanager
def _reader(v):
    """A UDP socket that reads every datagram and a TCP server that reads every byte, in the namespace: yields
    their ports."""
    p = subprocess.Popen(v.exec(sys.executable, "-c", READER, v.peer), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        udp, tcp = (int(x) for x in p.stdout.readline().split())
        yield udp, tcp
    finally:
        p.kill()
        stop_helper(p)


def _tag(kind: str, i: int) -> bytes:
    return f"fcap-{kind}-{i:04d}-".encode() * 2


def _send(v, open_port: int, closed: int, tcp_port: int = 0, pace: float = 0.002) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(N):
            s.sendto(_tag("open", i), (v.peer, open_port))
            s.sendto(_tag("closed", i), (v.peer, closed))
            time.sleep(pace)
    if tcp_port:
        with socket.create_connection((v.peer, tcp_port), timeout=5) as c:
            for i in range(N):
                c.sendall(_tag("tcp", i))
                time.sleep(0.002)
    time.sleep(0.5 * SLOW)


def _capture(tmp_path, v, args: list[str], traffic, name: str = "t.pcapng"):
    path = tmp_path / name
    f = start_fcap(args + ["-w", str(path)])
    try:
        traffic()
    finally:
        f.stop()
    assert f.p.returncode == 0, f.stderr
    return read_packets(path), path, f.stderr


def _tag_of(p) -> str | None:
    m = re.search(rb"fcap-(\w+)-(\d{4})-", p.l3)
    return f"{m.group(1).decode()}-{m.group(2).decode()}" if m else None


def _by_id(recs) -> dict[int, list]:
    out: dict[int, list] = {}
    for p in sorted(recs, key=lambda p: p.ts_ns):
        out.setdefault(p.packet_id, []).append(p)
    return out


def _skb(p) -> int:
    return int(re.match(r"skb=0x([0-9a-f]+)", p.comment).group(1), 16)


POINTS = ["-i", "dev:queue", "-i", "dev:receive", "-i", "skb:drop", "-i", "skb:consume"]


def test_track_starts_only_on_what_the_filter_chose(tmp_path, veth_ns):
    """--track 'udp port OPEN' with datagrams to OPEN (read by a socket: freed where no skb tracepoint fires) and to
    a closed port in between (their skbs and heads are the freed ones handed out again; ICMP errors come back):
    every record is a datagram to OPEN, each id's records are one datagram (its tag), every datagram has one id,
    the comment's skb is the real skb (one address per record's life, not the id), the summary counts N packets
    and no clones."""
    v = veth_ns
    with _reader(v) as (port, _tcp):
        closed = port + 1 if port < 65000 else port - 1
        recs, _path, err = _capture(tmp_path, v, POINTS + ["--track", f"udp port {port}"],
                                    lambda: _send(v, port, closed))
    bad = [(p.iface_name, flow_of(p), p.l3[:60]) for p in recs if flow_of(p) is None or flow_of(p).dport != port]
    assert not bad, f"records of packets --track did not start on: {bad[:5]}"
    ids = _by_id(recs)
    tags = {pid: {_tag_of(p) for p in ps} for pid, ps in ids.items()}
    assert all(len(t) == 1 for t in tags.values()), tags
    per_tag: dict[str, set] = {}
    for pid, t in tags.items():
        per_tag.setdefault(t.pop(), set()).add(pid)
    assert sorted(per_tag) == sorted(f"open-{i:04d}" for i in range(N)), sorted(per_tag)
    assert all(len(s) == 1 for s in per_tag.values()), per_tag
    for ps in ids.values():
        assert [p.iface_name for p in ps][:2] == ["dev:queue", "dev:receive"], [p.iface_name for p in ps]
        assert all(_skb(p) != p.packet_id for p in ps)
    assert re.search(rf"^{N} packets tracked \(0 clones\), 0 tracking entries evicted", err, re.M), err


def test_track_tcp_and_excluded_udp(tmp_path, veth_ns):
    """--track 'tcp port P' with a TCP stream to a reading server and UDP to a closed port in between: no UDP or
    ICMP record; each id's records are one segment (sequence number, flags, length the same at every point)."""
    v = veth_ns
    with _reader(v) as (port, tcp_port):
        recs, _path, err = _capture(tmp_path, v, POINTS + ["--track", f"tcp port {tcp_port}"],
                                    lambda: _send(v, port, port + 1, tcp_port))
    assert recs and all(flow_of(p) is not None and flow_of(p).proto == 6 for p in recs), \
        [flow_of(p) for p in recs if flow_of(p) is None or flow_of(p).proto != 6][:5]
    for pid, ps in _by_id(recs).items():
        segs = {_segment(p) for p in ps}
        assert len(segs) == 1, (pid, [(p.iface_name, _segment(p)) for p in ps])
    m = re.search(r"^(\d+) packets? tracked \((\d+) clones\)", err, re.M)
    assert m and int(m.group(1)) == len(_by_id(recs)), (err, len(_by_id(recs)))


def _segment(p) -> tuple:
    b = p.l3
    ihl = (b[0] & 15) * 4
    t = b[ihl:]
    return int.from_bytes(t[4:8], "big"), t[13], int.from_bytes(b[2:4], "big") - ihl - (t[12] >> 4) * 4


def test_one_id_per_packet_without_track(tmp_path, veth_ns):
    """Several points, no --track: N datagrams over the veth pair (read in the namespace: the same skb address and
    head again and again) get N different packet ids, each datagram's records at dev:queue and dev:receive one id
    (Wireshark's frame.packet_id); the comment keeps the skb's address."""
    v = veth_ns
    with _reader(v) as (port, _tcp):
        recs, path, _err = _capture(tmp_path, v, ["-i", "dev:queue", "-i", "dev:receive", f"udp port {port}"],
                                    lambda: _send(v, port, port + 1))
    rows = [[str(p.packet_id), p.iface_name] for p in recs]
    if shutil.which("tshark"):   # (Wireshark's reading, where it is installed: the same)
        rows = [r for r in tshark_rows(path, "frame.packet_id", "frame.interface_name") if len(r) == 2]
    assert len(rows) == 2 * N, rows
    ids: dict[str, list] = {}
    for pid, iface in rows:
        ids.setdefault(pid, []).append(iface)
    assert len(ids) == N and all(sorted(x) == ["dev:queue", "dev:receive"] for x in ids.values()), ids
    tags = {pid: {_tag_of(p) for p in ps} for pid, ps in _by_id(recs).items()}
    assert all(len(t) == 1 for t in tags.values()), tags


def test_one_point_each_record_its_own_id(tmp_path, veth_ns):
    """One point: every record its own id (a point sees a packet once)."""
    v = veth_ns
    with _reader(v) as (port, _tcp):
        recs, _path, _err = _capture(tmp_path, v, ["-i", "dev:queue", f"udp port {port}"],
                                     lambda: _send(v, port, port + 1))
    assert len(recs) == N and len({p.packet_id for p in recs}) == N


# ---- against the kernel's own view (tracefs) ----------------------------------------------------------------------

TRACEFS = "/sys/kernel/tracing"
ORACLE_EVENTS = ("net/net_dev_queue", "net/netif_receive_skb", "skb/kfree_skb", "skb/consume_skb",
                 "kmem/kmem_cache_free", "kmem/kmem_cache_alloc")


@contextlib.contextmanager
def _tracefs():
    """The kernel's events, raw pointers, monotonic clock: yields a function that returns the trace so far."""
    if not os.path.exists(f"{TRACEFS}/events/kmem"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], capture_output=True)
    if not os.path.exists(f"{TRACEFS}/events/kmem/kmem_cache_free"):
        pytest.skip("no tracefs with kmem events here")

    def w(name: str, value: str) -> None:
        with open(f"{TRACEFS}/{name}", "w") as f:
            f.write(value)
    w("tracing_on", "0")
    w("trace", "")
    w("trace_clock", "mono")
    w("buffer_size_kb", "16384")
    try:
        w("trace_options", "nohash-ptr")
    except OSError:   # (older kernels: no such option; their pointers are hashed)
        pytest.skip("tracefs here hashes the pointers it prints (no nohash-ptr option)")
    for e in ORACLE_EVENTS:
        w(f"events/{e}/enable", "1")
    for e in ("kmem_cache_free", "kmem_cache_alloc"):
        for f in ('name ~ "skbuff_*"', 'name == "skbuff_head_cache" || name == "skbuff_fclone_cache"'):
            with contextlib.suppress(OSError):   # (else every cache's events: the overrun check below)
                w(f"events/kmem/{e}/filter", f)
                break
    w("tracing_on", "1")

    def text() -> str:
        w("tracing_on", "0")
        if _overrun():
            pytest.skip("the trace lost events (its buffer overran): no oracle this time")
        return open(f"{TRACEFS}/trace").read()
    try:
        yield text
    finally:
        w("tracing_on", "0")
        for e in ORACLE_EVENTS:
            w(f"events/{e}/enable", "0")
        for e in ("kmem_cache_free", "kmem_cache_alloc"):
            with contextlib.suppress(OSError):
                w(f"events/kmem/{e}/filter", "0")
        with contextlib.suppress(OSError):
            w("trace_options", "hash-ptr")


def _overrun() -> int:
    total = 0
    for cpu in os.listdir(f"{TRACEFS}/per_cpu"):
        with contextlib.suppress(OSError), open(f"{TRACEFS}/per_cpu/{cpu}/stats") as f:
            total += sum(int(ln.split()[1]) for ln in f if ln.startswith("overrun:"))
    return total


_EVENT = re.compile(r"^\s*.+?-\d+\s+\[\d+\]\s+\S+\s+(\d+)\.(\d+): (\w+): .*?(?:skbaddr|ptr)=(?:0x)?([0-9a-f]+)")
_POINT = {"net_dev_queue": "dev:queue", "netif_receive_skb": "dev:receive", "kfree_skb": "skb:drop",
          "consume_skb": "skb:consume"}


_LEN = re.compile(r" len=(\d+)")


def _lives(trace: str) -> tuple[dict[tuple[str, int], list[tuple[int, int]]], dict[int, int]]:
    """(point, skb) -> (monotonic ns, life number) of each time the kernel passed that point with that skb, and each
    life's IP length (its net_dev_queue's length less the veth's Ethernet header). A life of an address ends at its
    kmem_cache_free, kfree_skb or consume_skb, or a kmem_cache_alloc of it. Newer kernels (7.2 here) also free a
    read datagram's skb into a per-CPU cache and allocate from it with none of those events; every packet of this
    traffic is queued once (datagrams on the veth into the namespace, ICMP errors back), so a net_dev_queue begins a
    life too."""
    life: dict[int, int] = {}
    nxt = 0
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    iplen: dict[int, int] = {}
    for line in trace.splitlines():
        m = _EVENT.match(line)
        if not m:
            continue
        sec, frac, ev, addr = m.group(1), m.group(2), m.group(3), int(m.group(4), 16)
        ts = int(sec) * 10**9 + int(frac.ljust(9, "0"))
        if ev in ("kmem_cache_alloc", "net_dev_queue") or addr not in life:
            nxt += 1
            life[addr] = nxt
        if ev == "net_dev_queue" and (n := _LEN.search(line)):
            iplen[life[addr]] = int(n.group(1)) - 14
        if ev in _POINT:
            out.setdefault((_POINT[ev], addr), []).append((ts, life[addr]))
        if ev in ("kmem_cache_free", "kfree_skb", "consume_skb"):
            life.pop(addr, None)
    return out, iplen


# the oracle's datagrams this far apart: a record matches its passage of the trace unmistakably, within half of it
# (an emulated CPU stalls for up to ~0.1 s between the trace's probe and fcap's: 102 ms seen on 6.1 under TCG)
PACE = 0.05 * SLOW


def test_track_ids_stay_in_one_life(tmp_path, veth_ns):
    """The --track capture of test_track_starts_only_on_what_the_filter_chose with the kernel's events traced
    beside it: each record is matched to the trace's passage of its point by its skb nearest in time (monotonic);
    every id's records lie in one life of one skb (no clones here), and no life carries two ids."""
    v = veth_ns
    offset = time.time_ns() - time.monotonic_ns()   # (fcap's own, sampled at its start, within microseconds)
    with _reader(v) as (port, _tcp), _tracefs() as trace:
        # (a datagram read before the capture: in the guests the trace missed the reader's first consume_skb)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"warm-up", (v.peer, port))
        time.sleep(0.2 * SLOW)
        recs, _path, _err = _capture(tmp_path, v, POINTS + ["--track", f"udp port {port}"],
                                     lambda: _send(v, port, port + 1, pace=PACE))
        text = trace()
    # (the warm-up's skb may be freed while the capture runs: a packet first seen there, with an id of its own)
    warm = [p for p in recs if b"warm-up" in p.l3]
    assert all(p.iface_name == "skb:consume" for p in warm), [p.iface_name for p in warm]
    recs = [p for p in recs if p not in warm]
    lives, iplen = _lives(text)
    if not lives:
        pytest.skip("tracefs recorded no events")
    for p in recs:
        assert lives.get((p.iface_name, _skb(p))), (p.iface_name, hex(_skb(p)), "a record the kernel did not trace")

    def nearest(p, off: int) -> tuple[int, int]:
        """The passage of the record's point by its skb nearest in time, in a life of a packet of its length: an
        emulated CPU can stall for many ms between the trace's probe and fcap's, while the skb's address is handed
        to another packet (an ICMP error, a datagram of another length) in the meantime."""
        own = int.from_bytes(p.l3[2:4], "big")
        passages = [o for o in lives[(p.iface_name, _skb(p))] if iplen.get(o[1]) == own]
        assert passages, (p.iface_name, hex(_skb(p)), own, "no life of a packet of this length at this skb")
        return min(passages, key=lambda o: abs(o[0] - (p.ts_ns - off)))
    # the two clocks' offset as the records themselves say (the one sampled here is off by the time between samples,
    # far more under emulation)
    drift = sorted(p.ts_ns - offset - nearest(p, offset)[0] for p in recs)
    offset += drift[len(drift) // 2]
    life_of: dict[int, set] = {}
    for p in recs:
        ts, n = nearest(p, offset)
        # (within half the pace: nearer to its own passage than to the next datagram's at that skb)
        assert abs(ts - (p.ts_ns - offset)) < PACE * 1e9 / 2, (p.iface_name, ts, p.ts_ns - offset)
        life_of.setdefault(p.packet_id, set()).add((_skb(p), n))
    assert len(life_of) == N, len(life_of)
    for pid, lv in life_of.items():
        assert len(lv) == 1, (pid, lv)
    owners: dict[tuple, int] = {}
    for pid, lv in life_of.items():
        for life in lv:
            assert owners.setdefault(life, pid) == pid, (life, pid, owners[life])


# ---- pure ---------------------------------------------------------------------------------------------------------

def test_modes_and_seen_bits():
    """How records get ids: --track; several points (the map); one point (each its own); none without metadata.
    Each point its own power-of-two share of the 64 seen bits, none past 64 points."""
    from fcap.kernel.track import IDENT_EACH, IDENT_MAP, IDENT_NONE, IDENT_TRACK, mode, seen_slots
    assert [mode(True, 1), mode(False, 3), mode(False, 1), mode(False, 3, ids=False)] == \
        [IDENT_TRACK, IDENT_MAP, IDENT_EACH, IDENT_NONE]
    assert [seen_slots(n) for n in (1, 2, 3, 4, 5, 33, 64, 65)] == [64, 32, 16, 16, 8, 1, 1, 0]
    for n in range(1, 65):
        k = seen_slots(n)
        assert k * n <= 64 and k & (k - 1) == 0
