"""End to end on the running kernel, what fcap captures at each kind of point: on lo and over a veth pair, byte for
byte what tcpdump captures of the same traffic; at raw_tp, fentry/fexit/kprobe and kfree_skb (LINUX_SLL2) too."""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import struct
import sys
import time
import types
from collections import defaultdict

import pytest
from conftest import kernel_refusal, need_root, require_kind

from netns import (
    ETH_HLEN,
    LINKTYPE_EN10MB,
    LINKTYPE_RAW,
    Peer,
    SLOW,
    Pkt,
    UDPSink,
    flow_of,
    gso_max_size,
    ipv6_loopback,
    l4_payload,
    payload,
    ping,
    read_packets,
    run_fcap,
    send_udp,
    softnet_drops,
    start_fcap,
    start_tcpdump,
    tcp_bulk,
    udp_sizes,
)
from packets import summary
from tsharkutil import tshark_rows

# A perf sample holds at most 64 KiB: fcap keeps the largest prefix of a bigger skb (GSO/BIG TCP on lo) that
# fits, with its true length. Anything this long or longer may legitimately arrive truncated.
PERF_LIMIT_FLOOR = 64000
SETTLE = 0.3 * SLOW   # after the last packet: let both tools read what the kernel already handed them


def _icmp_tagged(p: Pkt, tag: bytes) -> bool:
    f = flow_of(p)
    return f is not None and f.proto in (1, 58) and tag in p.l3


def compare_captures(ours: list[Pkt], theirs: list[Pkt], what: str, gso_split_above: int | None = None) -> dict:
    """fcap's packets vs tcpdump's: the same packets per flow direction, in order, with the same bytes from the
    network header on and the same original length. Returns counts for the caller's own checks.

    Both lists are put in timestamp order first: fcap drains its per-CPU buffers one CPU at a time, and packets
    of different flows sent concurrently on two CPUs may pass the tracepoint and the tap in different orders;
    within one flow direction (one socket, under its lock) the order is the same for both tools, but for
    neighbours on receive that two CPUs' backlogs processed in the other order (_bring_forward).

    gso_split_above: at net_dev_queue the skb is the one TCP built; validate_xmit_skb, which runs after the
    tracepoint and before the tap, segments a GSO skb of that many bytes or more (the device's gso_max_size) in
    software. Such an skb is matched against the run of segments tcpdump saw: same sequence numbers, same
    payload bytes."""
    assert theirs, f"{what}: tcpdump captured none of the test traffic"
    by_flow_ours, by_flow_theirs = defaultdict(list), defaultdict(list)
    for p in sorted(ours, key=lambda p: p.ts_ns):
        by_flow_ours[flow_of(p)].append(p)
    for p in sorted(theirs, key=lambda p: p.ts_ns):
        by_flow_theirs[flow_of(p)].append(p)
    assert set(by_flow_ours) == set(by_flow_theirs), (f"{what}: different flows: fcap {_flows(ours)}, "
                                                      f"tcpdump {_flows(theirs)}")
    truncated = split = 0
    for flow, mine in by_flow_ours.items():
        ref = by_flow_theirs[flow]
        i = j = 0
        while i < len(mine) and j < len(ref):
            _bring_forward(mine[i], ref, j)
            a, b = mine[i], ref[j]
            where = f"{what}: {flow} fcap packet {i} / tcpdump packet {j}"
            assert len(b.l3) == b.orig_l3_len, f"{where}: tcpdump truncated it (snaplen too small?)"
            if (a.orig_l3_len != b.orig_l3_len and gso_split_above is not None and flow.proto == 6
                    and a.orig_l3_len + ETH_HLEN >= gso_split_above):
                j = _match_split(a, ref, j, where)
                split += 1
                truncated += len(a.l3) < a.orig_l3_len
                i += 1
                continue
            assert a.orig_l3_len == b.orig_l3_len, f"{where}: original length {a.orig_l3_len} vs {b.orig_l3_len}"
            if len(a.l3) < a.orig_l3_len:
                truncated += 1
                _check_truncation(a, where)
                assert a.l3 == b.l3[:len(a.l3)], f"{where}: the kept prefix differs from tcpdump's bytes"
            else:
                assert len(a.l3) == len(b.l3), f"{where}: {len(a.l3)} bytes vs {len(b.l3)}"
                assert a.l3 == b.l3, f"{where}: bytes differ at offset {_first_diff(a.l3, b.l3)}"
            i += 1
            j += 1
        assert i == len(mine) and j == len(ref), (f"{what}: {flow}: fcap has {len(mine) - i} more packets, "
                                                  f"tcpdump {len(ref) - j} more")
    return {"packets": len(ours), "truncated": truncated, "split": split}


REORDER_WINDOW = 4


def _bring_forward(a: Pkt, ref: list[Pkt], j: int) -> None:
    """On receive, tcpdump's timestamp is the skb's, taken when veth's transmit put it on one CPU's backlog;
    fcap's is taken at the tracepoint, when that CPU's softirq processes it. Two packets of one flow put on two
    CPUs' backlogs can be processed in the other order, so the two timestamp orders may swap neighbours. If
    ref[j] is not `a` but one of the next few is, byte for byte, move that one to j; any other difference is
    left for the caller's checks to report."""
    if j >= len(ref) or _same(a, ref[j]):
        return
    for k in range(j + 1, min(j + REORDER_WINDOW, len(ref))):
        if _same(a, ref[k]):
            ref.insert(j, ref.pop(k))
            return


def _same(a: Pkt, b: Pkt) -> bool:
    return a.orig_l3_len == b.orig_l3_len and a.l3 == b.l3


def _check_truncation(a: Pkt, where: str) -> None:
    """Only a packet too big for one perf sample may be cut, and then to a 64 KiB prefix, never less."""
    assert a.orig_l3_len + ETH_HLEN > PERF_LIMIT_FLOOR, f"{where}: {a.orig_l3_len}-byte packet cut to {len(a.l3)}"
    assert len(a.raw) >= PERF_LIMIT_FLOOR, f"{where}: kept only {len(a.raw)} of {a.orig_l3_len} bytes"


def _first_diff(x: bytes, y: bytes) -> int:
    return next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))


def _tcp(p: Pkt) -> tuple[int, int, int, bytes]:
    """(seq, ack, payload length from the original length, captured payload) of a TCP/IP packet. The IPv4
    total length is not used: a BIG TCP skb over 64 KiB carries 0 there."""
    b = p.l3
    ip_hlen = (b[0] & 15) * 4 if b[0] >> 4 == 4 else 40
    t = b[ip_hlen:]
    doff = (t[12] >> 4) * 4
    return (int.from_bytes(t[4:8], "big"), int.from_bytes(t[8:12], "big"), p.orig_l3_len - ip_hlen - doff,
            bytes(t[doff:]))


def _match_split(a: Pkt, ref: list[Pkt], j: int, where: str) -> int:
    """fcap's GSO skb `a` against the segments ref[j:...] tcpdump saw after software segmentation; returns the
    index after the last segment."""
    if len(a.l3) < a.orig_l3_len:
        _check_truncation(a, where)
    seq, ack, total, data = _tcp(a)
    got = bytearray()
    start = j
    while len(got) < total:
        assert j < len(ref), f"{where}: the segments tcpdump saw carry {len(got)} of the skb's {total} bytes"
        s_seq, s_ack, s_len, s_data = _tcp(ref[j])
        assert s_seq == (seq + len(got)) & 0xFFFFFFFF, f"{where}: segment {j - start} has seq {s_seq}"
        assert s_ack == ack, f"{where}: segment {j - start} has ack {s_ack}, the skb {ack}"
        assert len(s_data) == s_len
        got += s_data
        j += 1
    assert len(got) == total, f"{where}: segments carry {len(got)} bytes, the skb {total}"
    assert j - start >= 2, f"{where}: a {a.orig_l3_len}-byte skb vs one {ref[start].orig_l3_len}-byte packet"
    assert data == bytes(got[:len(data)]), f"{where}: payload differs at {_first_diff(data, bytes(got))}"
    return j


def _flows(pkts: list[Pkt]) -> dict:
    d: dict = defaultdict(int)
    for p in pkts:
        d[flow_of(p)] += 1
    return dict(d)


def _stop_all(*procs) -> None:
    for p in procs:
        if p is not None:
            p.kill()


# ---- 1. lo: fcap at net_dev_queue vs tcpdump -i lo ------------------------------------------------------

def _lo_traffic(seed: int, tag: bytes, v6: bool) -> dict:
    """UDP/IPv4 (+IPv6) of seeded random sizes, a 300 KB TCP transfer, ping with a tagged payload.
    Returns what identifies this traffic among whatever else lo carries."""
    sinks = [UDPSink("127.0.0.1")] + ([UDPSink("::1")] if v6 else [])
    sizes = udp_sizes(seed)
    ports: set[int] = set()
    try:
        for sink in sinks:
            addr = sink.sock.getsockname()[0]
            pays = [payload(seed, n) for n in sizes]
            ports.add(send_udp(addr, sink.port, pays, pace=0.0005))
            ports.add(sink.port)
            sink.wait(len(pays))
            assert len(sink.received) == len(pays), f"UDP to {addr}: {len(sink.received)} of {len(pays)} arrived"
    finally:
        for s in sinks:
            s.close()
    tcp_ports = tcp_bulk("127.0.0.1", TCP_BYTES, seed=seed)
    pinged = shutil.which("ping") is not None
    if pinged:
        ping("127.0.0.1", 3, pattern=tag.hex())
        if v6:
            ping("::1", 3, pattern=tag.hex())
    return {"udp_ports": ports, "tcp_ports": set(tcp_ports), "tcp_server": tcp_ports[0], "sizes": sizes,
            "families": len(sinks), "ping": pinged}


def _is_ours(t: dict, tag: bytes):
    def mine(p: Pkt) -> bool:
        f = flow_of(p)
        if f is None:
            return False
        if f.proto == 17:
            return f.sport in t["udp_ports"] and f.dport in t["udp_ports"]
        if f.proto == 6:
            return {f.sport, f.dport} == t["tcp_ports"]
        return f.proto in (1, 58) and tag in p.l3
    return mine


TCP_BYTES = 300_000


ATTEMPTS = 3


def _reference_spoiled(td, drops_before: int) -> str:
    """Why tcpdump's capture cannot serve as the reference: it dropped packets itself (its ring overflowed while
    the machine was busy), or the kernel dropped packets between lo's transmit and receive (tcpdump -i lo sees the
    received copy only). Empty when it is good."""
    why = []
    m = re.search(r"^(\d+) packets? dropped by kernel", td.stderr, re.M)
    if m is None:
        why.append(f"tcpdump printed no drop count: {td.stderr!r}")
    elif int(m.group(1)):
        why.append(f"tcpdump dropped {m.group(1)} packets")
    lost = softnet_drops() - drops_before
    if lost:
        why.append(f"the kernel's input backlog dropped {lost} packets")
    return ", ".join(why)


def _attempts(what: str, once) -> None:
    """Run once() (a whole capture + comparison) until tcpdump's side is a clean reference; a clean attempt's
    comparison decides. Skips, saying why, only when every attempt's reference was spoiled."""
    spoiled = []
    for i in range(ATTEMPTS):
        why = once(i)
        if not why:
            return
        spoiled.append(f"attempt {i + 1}: {why}")
    pytest.skip(f"{what}: no clean tcpdump reference in {ATTEMPTS} attempts (busy machine?): {'; '.join(spoiled)}")


def _tcp_stream_ok(pkts: list[Pkt], nbytes: int, what: str) -> None:
    """The data direction's segments (retransmissions included) cover exactly nbytes of sequence space after
    the SYN, without a gap."""
    syn = [p for p in pkts if _tcp_flags(p) & 2]
    assert syn, f"{what}: no SYN captured"
    isn = _tcp(syn[0])[0]
    covered: list[tuple[int, int]] = []
    for p in pkts:
        seq, _ack, n, _data = _tcp(p)
        if n > 0:
            rel = (seq - isn - 1) & 0xFFFFFFFF
            covered.append((rel, rel + n))
    covered.sort()
    end = 0
    for a, b in covered:
        assert a <= end, f"{what}: no segment carries bytes {end}..{a}"
        end = max(end, b)
    assert end == nbytes, f"{what}: the segments cover {end} bytes, not {nbytes}"


def _tcp_flags(p: Pkt) -> int:
    b = p.l3
    ip_hlen = (b[0] & 15) * 4 if b[0] >> 4 == 4 else 40
    return b[ip_hlen + 13]


@pytest.mark.parametrize("point", ["tp_btf/net_dev_queue", "tp_btf/net_dev_start_xmit"])
def test_lo_matches_tcpdump(tcpdump, tmp_path, point):
    """UDP/IPv4+IPv6 of random sizes, a 300 KB TCP transfer (payload in page frags, GSO), ICMP echo: fcap sees
    the packets tcpdump -i lo sees, with the same bytes from the network header on and the same lengths.

    net_dev_start_xmit runs right after the tap (xmit_one), so there every packet must match one to one;
    net_dev_queue runs before validate_xmit_skb, so a GSO skb over lo's gso_max_size is one packet for fcap
    and its software segments for tcpdump (compare_captures matches those by sequence number and payload)."""
    v6 = ipv6_loopback()

    def once(attempt: int) -> str:
        seed = random.randrange(1 << 30)
        ours_path, theirs_path = tmp_path / f"fcap{attempt}.pcapng", tmp_path / f"tcpdump{attempt}.pcap"
        tag = random.Random(seed).randbytes(8)
        fc = td = None
        drops = softnet_drops()
        try:
            fc = start_fcap(["-i", point, "-w", str(ours_path)])
            td = start_tcpdump("lo", theirs_path)
            t = _lo_traffic(seed, tag, v6)
            time.sleep(SETTLE)
            assert td.stop() == 0, td.stderr
            assert fc.stop() == 0, fc.stderr
        finally:
            _stop_all(fc, td)
        spoiled = _reference_spoiled(td, drops)
        if spoiled:
            return spoiled
        assert summary(fc.stderr)["dropped by kernel"] == 0, fc.stderr
        mine = _is_ours(t, tag)
        ours = [p for p in read_packets(ours_path) if mine(p)]
        theirs = [p for p in read_packets(theirs_path) if mine(p)]
        assert {p.linktype for p in ours} == {LINKTYPE_EN10MB}
        assert {p.linktype for p in theirs} == {LINKTYPE_EN10MB}
        split_above = gso_max_size("lo") if point.endswith("net_dev_queue") else None
        n = compare_captures(ours, theirs, f"lo at {point} (seed {seed})", gso_split_above=split_above)
        # the traffic itself, as fcap saw it
        udp = [p for p in ours if flow_of(p).proto == 17]
        assert sorted(len(l4_payload(p)) for p in udp) == sorted(t["sizes"] * t["families"])
        assert {l4_payload(p) for p in udp} == {payload(seed, k) for k in t["sizes"]}
        tcp = [p for p in ours if flow_of(p).proto == 6]
        data_dir = [p for p in tcp if flow_of(p).dport == t["tcp_server"]]
        _tcp_stream_ok(data_dir, TCP_BYTES, f"lo at {point}")
        # TCP on lo keeps the payload in page frags: the big segments must have arrived whole (or, past the
        # perf sample limit, as a ~64 KiB prefix, counted in n["truncated"])
        big = [p for p in tcp if p.orig_l3_len > 16000]
        assert big, "no large (GSO, paged) segment in the TCP transfer"
        assert all(len(p.l3) == p.orig_l3_len or len(p.raw) >= PERF_LIMIT_FLOOR for p in big)
        if t["ping"]:
            icmp = [p for p in ours if flow_of(p).proto in (1, 58)]
            assert len(icmp) == 6 * (2 if v6 else 1), f"{len(icmp)} ICMP echo packets"
        print(f"{point}: {n}")
        return ""

    _attempts(f"lo at {point}", once)


# ---- 2. veth into a namespace: fcap at netif_receive_skb vs tcpdump -i vethA -Q in --------------------------

def test_veth_receive_matches_tcpdump(tcpdump, veth_ns, tmp_path):
    """Packets coming back from a namespace over a veth pair (UDP echoes, a 300 KB TCP download): fcap at
    tp_btf/netif_receive_skb vs tcpdump -Q in on the root-namespace end."""
    v = veth_ns

    def once(attempt: int) -> str:
        seed = random.randrange(1 << 30)
        ours_path, theirs_path = tmp_path / f"fcap{attempt}.pcapng", tmp_path / f"tcpdump{attempt}.pcap"
        rnd = random.Random(seed)
        sizes = [rnd.randint(1, 1400) for _ in range(30)]     # within the veth MTU: no IP fragments
        fc = td = None
        peer = Peer(v, TCP_BYTES, seed)
        drops = softnet_drops()
        try:
            fc = start_fcap(["-i", "tp_btf/netif_receive_skb", "-w", str(ours_path)])
            td = start_tcpdump(v.a, theirs_path, "-Q", "in")
            udp_port = peer.udp_echo(v.peer, [payload(seed, n) for n in sizes])
            tcp_port = peer.fetch_tcp(v.peer)
            time.sleep(SETTLE)
            assert td.stop() == 0, td.stderr
            assert fc.stop() == 0, fc.stderr
        finally:
            _stop_all(fc, td)
            peer.close()
        spoiled = _reference_spoiled(td, drops)
        if spoiled:
            return spoiled
        assert summary(fc.stderr)["dropped by kernel"] == 0, fc.stderr

        def mine(p: Pkt) -> bool:
            f = flow_of(p)
            return (f is not None and f.src == v.peer and f.dst == v.local and
                    ((f.proto == 17 and (f.sport, f.dport) == (peer.udp_port, udp_port)) or
                     (f.proto == 6 and (f.sport, f.dport) == (peer.tcp_port, tcp_port))))

        ours = [p for p in read_packets(ours_path) if mine(p)]
        theirs = [p for p in read_packets(theirs_path) if mine(p)]
        n = compare_captures(ours, theirs, f"veth {v.a} (seed {seed})")
        udp = [p for p in ours if flow_of(p).proto == 17]
        assert [l4_payload(p) for p in by_time(udp)] == [payload(seed, k) for k in sizes]
        _tcp_stream_ok([p for p in ours if flow_of(p).proto == 6], TCP_BYTES, f"veth {v.a}")
        # what the pcapng says about each packet: received (epb_flags inbound) on vethA, in the root namespace
        root_netns = os.stat("/proc/self/ns/net").st_ino
        for p in ours:
            assert p.flags is not None and p.flags & 3 == 1, f"epb_flags {p.flags}: not inbound"
            meta = dict(kv.split("=", 1) for kv in (p.comment or "").split() if "=" in kv)
            assert meta.get("ifindex") == str(v.a_index), f"comment {p.comment!r}: not ifindex {v.a_index}"
            assert meta.get("netns") == str(root_netns), f"comment {p.comment!r}: not netns {root_netns}"
        print(n)
        return ""

    _attempts(f"veth {v.a}", once)


# ---- helpers, also for tests/test_capture_cli.py -----------------------------------------------------------------

def by_time(pkts: list[Pkt]) -> list[Pkt]:
    """Packets in timestamp order. fcap drains its per-CPU perf buffers one after the other, so a file can hold
    CPU 0's packets before CPU 1's earlier ones (a sender that migrates between CPUs mid-test does that)."""
    return sorted(pkts, key=lambda p: p.ts_ns)


PY_SEND = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
           "[s.sendto(bytes.fromhex(sys.argv[2]) + bytes([i]) * 40, ('127.0.0.1', int(sys.argv[1]))) "
           "for i in range(int(sys.argv[3]))]")


def _sender(port: int, tag: bytes, n: int) -> list[str]:
    """A command that sends n tagged UDP datagrams to 127.0.0.1:port (payload: tag + 40 × i)."""
    return [sys.executable, "-c", PY_SEND, str(port), tag.hex(), str(n)]


def _sent(tag: bytes, n: int) -> list[bytes]:
    return [tag + bytes([i]) * 40 for i in range(n)]


# ---- 3. raw_tp: the same bytes as tp_btf -------------------------------------------------------------------------

def test_raw_tp_same_bytes_as_tp_btf(sink, tmp_path):
    """raw_tp/net_dev_queue (context untyped: linear bytes only, at most 4096) and tp_btf/net_dev_queue in one
    capture: UDP datagrams (linear skbs on lo) come out the same from both, up to raw_tp's limit."""
    sizes = [1, 17, 300, 1400, 3000, 4082, 4083, 6000]   # 4082 + 14 = 4096: the largest whole one for raw_tp
    pays = [os.urandom(n) for n in sizes]
    path = str(tmp_path / "rawtp.pcapng")
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "-i", "raw_tp/net_dev_queue", "-w", path,
                     f"udp port {sink.port}"])
    try:
        send_udp("127.0.0.1", sink.port, pays)
        sink.wait(len(pays))
        time.sleep(SETTLE)
        assert fc.stop() == 0, fc.stderr
    finally:
        fc.kill()
    pkts = read_packets(path)
    typed = sorted((p for p in pkts if p.iface_name == "tp_btf/net_dev_queue"), key=lambda p: p.ts_ns)
    raw = sorted((p for p in pkts if p.iface_name == "raw_tp/net_dev_queue"), key=lambda p: p.ts_ns)
    assert len(typed) == len(raw) == len(pays), f"tp_btf {len(typed)}, raw_tp {len(raw)}, sent {len(pays)}"
    assert [l4_payload(p) for p in typed] == pays
    for i, (a, b) in enumerate(zip(typed, raw)):
        assert b.orig_l3_len == a.orig_l3_len, f"datagram {i}: raw_tp length {b.orig_l3_len}, tp_btf {a.orig_l3_len}"
        assert len(b.raw) == min(len(a.raw), 4096), f"datagram {i} ({sizes[i]} bytes): raw_tp kept {len(b.raw)}"
        assert b.raw == a.raw[:len(b.raw)], f"datagram {i}: raw_tp bytes differ at {_first_diff(a.raw, b.raw)}"


# ---- 4. fentry / fexit / kprobe (where the kernel allows them: the VM tier) --------------------------------------

@pytest.fixture
def quiet_sink(root):
    """A bound UDP socket nobody reads while the capture runs: at fexit the skb must still be alive (queued on
    this socket), not consumed and freed by a reader — fexit sees the skb after ip_output returned."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("127.0.0.1", 0))
    try:
        yield types.SimpleNamespace(sock=s, port=s.getsockname()[1])
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["fentry", "fexit", "kprobe", "bare"])
def test_function_points(quiet_sink, tmp_path, kind):
    """fcap -i KIND/ip_output -y raw -w out.pcap -- <send N UDP datagrams>: Raw IP, those datagrams.
    'bare': -i ip_output alone takes the best hook the kernel allows (fentry, else kprobe). (No -c N: the Nth
    record can arrive before the sender has exited, and -c would then end it with SIGTERM: status 143.)"""
    if kind == "bare":
        need_root()
        if kernel_refusal("fentry") is None:
            expect = "fentry"
        elif kernel_refusal("kprobe") is None:
            expect = "kprobe"
        else:
            pytest.skip(f"this kernel refuses fentry ({kernel_refusal('fentry')}) and kprobe "
                        f"({kernel_refusal('kprobe')}) programs; tests/test_errors.py checks the refusal")
        spec = "ip_output"
    else:
        require_kind(kind, "ip_output")
        expect, spec = kind, f"{kind}/ip_output"
    n = 5
    tag = os.urandom(8)
    path = str(tmp_path / f"{kind}.pcap")
    r = run_fcap(["-i", spec, "-y", "raw", "-w", path, f"udp port {quiet_sink.port}",
                  "--", *_sender(quiet_sink.port, tag, n)])
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert f"listening on {expect}/ip_output, link-type RAW" in err, err
    with open(path, "rb") as f:
        assert struct.unpack("<IHHiIII", f.read(24))[6] == LINKTYPE_RAW
    pkts = by_time(read_packets(path))
    assert [p.raw[0] for p in pkts] == [0x45] * n
    assert [l4_payload(p) for p in pkts] == _sent(tag, n)
    assert all(p.orig_l3_len == len(p.raw) for p in pkts)
    if shutil.which("tshark"):
        assert tshark_rows(path, "udp.dstport") == [[str(quiet_sink.port)]] * n


FROM_THE_SKB = re.compile(r"call (bpf_skb_output|kfunc)")   # helpers that copy from the skb (no fault handling)


@pytest.mark.parametrize("flags", [["-w", "x.pcapng"], ["-w", "x.pcap", "udp port 9"],
                                   ["--perf-buffer", "-w", "x.pcapng"], ["--stack", "-w", "x.pcapng"],
                                   ["-w", "x.pcapng", "udp[100:4] = 1"]])
def test_fexit_never_copies_from_a_skb_that_may_be_gone(root, tmp_path, flags):
    """At fexit the function may have freed the skb or handed it on (on lo: received and freed before ip_finish_output2
    returns). bpf_skb_output and skb dynptrs copy from it with no fault handling: a freed skb's garbage pointer there
    panicked 6.12 (general protection fault in skb_copy_bits, fexit/ip_finish_output2 --stack). fexit programs read
    the skb only through checked loads and probe reads (linear bytes); fentry's, where the skb is alive, still use
    them."""
    flags = [str(tmp_path / f) if f.startswith("x.") else f for f in flags]
    listings = {}
    for kind in ("fexit", "fentry"):
        r = run_fcap(["-i", f"{kind}/ip_finish_output2", *flags, "--dump-ebpf"], text=True)
        assert r.returncode == 0 and "call " in r.stdout, r.stderr
        listings[kind] = set(FROM_THE_SKB.findall(r.stdout))
    assert not listings["fexit"], listings["fexit"]
    if "--perf-buffer" in flags or "--stack" in flags:
        assert listings["fentry"], "the check sees no bpf_skb_output where fentry's perf path has one"


@pytest.mark.parametrize("func,family,addr,ethertype", [("ip_send_skb", socket.AF_INET, "127.0.0.1", 0x0800),
                                                        ("ip6_send_skb", socket.AF_INET6, "::1", 0x86DD)])
def test_before_the_ip_layer_names_the_protocol(tmp_path, func, family, addr, ethertype):
    """At fentry/ip_send_skb the kernel has not set skb->protocol yet (__ip_local_out does): the LINUX_SLL2
    header's protocol comes from the IP version, so the filter `udp port P` matches and Wireshark decodes IP/UDP;
    -y ipv4 / -y ipv6 keep their protocol's packets by the same reckoning."""
    require_kind("fentry", func)
    n, tag = 4, os.urandom(8)
    lt = "ipv4" if family == socket.AF_INET else "ipv6"
    paths = [str(tmp_path / f"{func}.pcapng"), str(tmp_path / f"{func}-{lt}.pcap")]
    with socket.socket(family, socket.SOCK_DGRAM) as rx:   # (open throughout: no ICMP errors quoting the tag)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        rx.bind((addr, 0))
        port = rx.getsockname()[1]
        send = ["--", sys.executable, "-c", "import socket, sys; s = socket.socket(int(sys.argv[1]), "
                "socket.SOCK_DGRAM); [s.sendto(bytes.fromhex(sys.argv[3]) + bytes([i]) * 40, (sys.argv[2], "
                "int(sys.argv[4]))) for i in range(4)]", str(int(family)), addr, tag.hex(), str(port)]
        runs = [run_fcap(["-i", f"fentry/{func}", "-w", paths[0], f"udp port {port}", *send]),
                run_fcap(["-i", f"fentry/{func}", "-y", lt, "-w", paths[1], *send])]
    for r in runs:
        assert r.returncode == 0, r.stderr.decode()
    assert f"listening on fentry/{func}, link-type LINUX_SLL2" in runs[0].stderr.decode()
    pkts = by_time(read_packets(paths[0]))
    assert [struct.unpack(">H", p.raw[:2])[0] for p in pkts] == [ethertype] * n, [p.raw[:20].hex() for p in pkts]
    assert [l4_payload(p) for p in pkts] == _sent(tag, n)
    pkts = by_time([p for p in read_packets(paths[1]) if tag in p.raw])
    assert [p.raw[0] >> 4 for p in pkts] == [4 if family == socket.AF_INET else 6] * n
    assert [l4_payload(p) for p in pkts] == _sent(tag, n)
    if shutil.which("tshark"):
        ip = "ip" if family == socket.AF_INET else "ipv6"
        assert tshark_rows(paths[0], "frame.protocols") == [[f"sll:ethertype:{ip}:udp:data"]] * n


# ---- 5. a drop point: LINUX_SLL2 ---------------------------------------------------------------------------------

def test_drop_point_linux_sll2(tmp_path):
    """tp_btf/kfree_skb is not a device point: LINUX_SLL2 by default, made from the skb (protocol, ifindex,
    ARPHRD_LOOPBACK, packet type) and followed by the network header, though the skb's data has moved past it.
    A datagram to a closed port on 127.0.0.1 is dropped there (no socket)."""
    need_root()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]      # free, and closed when the socket closes
    path = str(tmp_path / "drop.pcapng")
    data = b"dropped:" + os.urandom(24)
    fc = start_fcap(["-i", "tp_btf/kfree_skb", "-w", path, f"udp dst port {port}"])
    try:
        send_udp("127.0.0.1", port, [data])
        time.sleep(SETTLE)
        assert fc.stop() == 0, fc.stderr
    finally:
        fc.kill()
    assert "link-type LINUX_SLL2" in fc.stderr
    pkts = [p for p in read_packets(path) if data in p.raw]
    assert len(pkts) == 1, f"{len(pkts)} copies of the dropped datagram"
    p = pkts[0]
    proto, _res, ifindex, hatype, pkttype, halen = struct.unpack(">HHiHBB", p.raw[:12])
    assert (proto, ifindex, hatype, pkttype) == (0x0800, socket.if_nametoindex("lo"), 772, 0), p.raw[:20].hex()
    assert l4_payload(p) == data and p.orig_l3_len == 28 + len(data)
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: the LINUX_SLL2 header was checked by hand, not by Wireshark")
    rows = tshark_rows(path, "frame.protocols", "udp.dstport", "sll.ifindex")
    assert any(proto.startswith("sll:ethertype:ip:udp") and (dport, ifx) == (str(port), "1")
               for proto, dport, ifx in rows), rows
