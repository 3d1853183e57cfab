"""Linux's ancillary fields served from the skb in the capture program, on real packets: `inbound`/`outbound` at
a transmit and a receive point against `tcpdump -i` (whose kernel filter reads AF_PACKET's direction) on a veth,
every SKF_AD_* field against what the records (or a --where predicate on the same member) say of the same
packets, and protochain on live IPv6 traffic with extension headers against `tcpdump -r`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
from conftest import need_root, need_tool

from filterutil import NetNS, multiset_diff, tcpdump_filter
from netns import Peer, flow_of, read_packets, start_fcap, start_tcpdump, subprocess_env

TX, RX = "tp_btf/net_dev_start_xmit", "tp_btf/netif_receive_skb"
AD = 0xFFFFF000


# ---- inbound / outbound on a veth, against tcpdump -i ----------------------------------------------------

def _ours(v, pkts) -> list:
    out = []
    for p in pkts:
        f = flow_of(p)
        if f is not None and {f.src, f.dst} == {v.local, v.peer}:
            out.append(p)
    return out


def test_inbound_outbound_match_tcpdump_on_veth(veth_ns, tmp_path):
    """fcap at the transmit and the receive tracepoint (--ifname: the veth's) with `inbound`, `outbound`,
    `outbound and tcp`, `inbound and udp` keeps the packets `tcpdump -i VETH -Q in|out [tcp|udp]` keeps: the
    direction packet sockets give. (Not `tcpdump -i VETH inbound`: libpcap runs the filter in user space over the
    ring block that was current when it set the filter, where the pkttype load fails, and loses those packets.)"""
    need_tool("tcpdump")
    v = veth_ns
    exprs = {"in": "inbound", "out": "outbound", "out-tcp": "outbound and tcp", "in-udp": "inbound and udp"}
    tcpdump = {"in": ["-Q", "in"], "out": ["-Q", "out"], "out-tcp": ["-Q", "out", "tcp"], "in-udp": ["-Q", "in", "udp"]}
    dumps = {n: start_tcpdump(v.a, tmp_path / f"td-{n}.pcap", *tcpdump[n]) for n in exprs}
    caps = {}
    try:
        for n, e in exprs.items():
            caps[n] = start_fcap(["-i", TX, "-i", RX, "--ifname", v.a, "-w", str(tmp_path / f"fc-{n}.pcapng"), e])
        peer = Peer(v, 300_000, 7)
        try:
            peer.udp_echo(v.peer, [bytes([i]) * n for i, n in enumerate((1, 100, 1400, 3000, 9000))])
            peer.fetch_tcp(v.peer)
        finally:
            peer.close()
    finally:
        for p in [*caps.values(), *dumps.values()]:
            p.stop(signal.SIGINT)
    for n, e in exprs.items():
        got = _ours(v, read_packets(tmp_path / f"fc-{n}.pcapng"))
        want = _ours(v, read_packets(tmp_path / f"td-{n}.pcap"))
        assert want, f"tcpdump kept none of the traffic with {e!r}"
        # (a GSO skb longer than a perf record keeps its first ~64 KB in fcap's file: compare 60,000 bytes)
        g, w = (Counter((p.orig_l3_len, p.l3[:60000]) for p in x) for x in (got, want))
        assert g == w, multiset_diff(got, want, f"{e!r} at {TX} + {RX}")
        srcs = {flow_of(p).src for p in got}
        assert srcs == ({v.peer} if n.startswith("in") else {v.local}), (e, srcs)


# ---- every field, through the Python API, on lo in a namespace --------------------------------------------

TRAFFIC = r"""
import os, socket, sys, threading
tag0, tag1, port = bytes.fromhex(sys.argv[1]), bytes.fromhex(sys.argv[2]), int(sys.argv[3])
cpus = sorted(os.sched_getaffinity(0))
def udp(tag, fam, dst):
    r = socket.socket(fam, socket.SOCK_DGRAM); r.bind((dst, port))
    for mark in (0, 5, 7):
        s = socket.socket(fam, socket.SOCK_DGRAM)
        if mark:
            s.setsockopt(socket.SOL_SOCKET, 36, mark)
        for n in (10, 300, 2000):
            s.sendto(tag + bytes([mark]) * n, (dst, port)); r.recv(65536)
        s.close()
    r.close()
def tcp():
    srv = socket.create_server(("127.0.0.1", 0)); p = srv.getsockname()[1]
    def serve():
        c, _ = srv.accept(); c.sendall(b"x" * 100000); c.close()
    t = threading.Thread(target=serve); t.start()
    c = socket.create_connection(("127.0.0.1", p)); n = 0
    while (d := c.recv(65536)):
        n += len(d)
    t.join(); c.close(); srv.close()
os.sched_setaffinity(0, {cpus[0]})
udp(tag0, socket.AF_INET, "127.0.0.1"); udp(tag0, socket.AF_INET6, "::1"); tcp()
os.sched_setaffinity(0, {cpus[-1]})
udp(tag1, socket.AF_INET, "127.0.0.1"); udp(tag1, socket.AF_INET6, "::1")
"""


def _ld(field: int, *test) -> list:
    """`A = ancillary field; if A <op> k: accept`: test = (jump code, k)."""
    code, k = test
    return [(0x20, 0, 0, AD + field), (code, 0, 1, k), (0x06, 0, 0, 262144), (0x06, 0, 0, 0)]


JEQ, JGT = 0x15, 0x25


class Api:
    """Sessions through fcap's Python API at the transmit and receive points of lo in a namespace, each with a
    filter (a cBPF program or an expression) or a --where predicate; the same traffic crosses them all."""

    def __init__(self, ns: NetNS):
        self.ns = ns
        self.sessions: dict[str, object] = {}

    def add(self, name: str, cbpf=None, expr: str | None = None, where: str | None = None) -> None:
        from fcap.kernel import predicates as pr
        from fcap.live.session import Config, Session
        preds = [lambda p: pr.netns(self.ns.inum)] + ([lambda p: pr.where(p, where)] if where else [])
        s = Session(Config(points=["tp_btf/net_dev_queue", RX], linktype="EN10MB", filter=expr, predicates=preds,
                           buffer_kib=1024))
        s.resolve()
        if cbpf is not None:
            s.cbpf = list(cbpf)
        s.open()
        s.attach()
        self.sessions[name] = s

    def drain(self) -> dict[str, list]:
        out = {}
        for name, s in self.sessions.items():
            recs: list = []
            s.run(lambda r, recs=recs: recs.append(r) or True, stop=lambda: True)
            assert s.read_counters().lost == 0, f"{name}: records lost"
            s.close()
            out[name] = recs
        return out

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()


def _rkey(r) -> tuple:
    return r.point, r.data, r.orig_len


FIELDS = {   # name: (program, what the unfiltered records say it keeps; None: compared with a session of its own)
    "mark == 5": (_ld(12, JEQ, 5), lambda r: r.mark == 5),
    "protocol == ip6": (_ld(0, JEQ, 0x86DD), lambda r: r.protocol == 0x86DD),
    "protocol == ip": (_ld(0, JEQ, 0x0800), lambda r: r.protocol == 0x0800),
    "ifindex == 1": (_ld(8, JEQ, 1), lambda r: r.ifindex == 1),
    "ifindex == 2": (_ld(8, JEQ, 2), lambda r: r.ifindex == 2),
    "hatype == loopback": (_ld(28, JEQ, 772), lambda r: r.hatype == 772),
    "pkttype == outgoing": (_ld(4, JEQ, 4), lambda r: r.point == 0),
    "pkttype == host": (_ld(4, JEQ, 0), lambda r: r.point == 1 and r.pkt_type == 0),
    "vlan present": (_ld(48, JEQ, 1), lambda r: False),
    "vlan tag == 0": (_ld(44, JEQ, 0), lambda r: True),
    "vlan tpid == 0": (_ld(60, JEQ, 0), lambda r: True),
    "rxhash > 2^31": (_ld(32, JGT, 0x7FFFFFFF), None),
    "queue == 0": (_ld(16, JEQ, 0), None),
    "inbound": ("inbound", lambda r: r.point == 1),
    "outbound and ip6": ("outbound and ip6", lambda r: r.point == 0 and r.protocol == 0x86DD),
}
WHERE = {"rxhash > 2^31": "skb->hash > 0x7fffffff", "queue == 0": "skb->queue_mapping == 0"}


@pytest.fixture(scope="module")
def api_run():
    """Every session of FIELDS (and the --where ones they are compared with, cpu == the first CPU, random), the
    traffic once (pinned to the first CPU, then to the last), the records of each."""
    need_root()
    need_tool("ip")
    tag0, tag1 = os.urandom(6), os.urandom(6)
    cpu0 = min(os.sched_getaffinity(0))
    with NetNS("fcapa") as ns:
        api = Api(ns)
        try:
            api.add("all")
            for name, (prog, _) in FIELDS.items():
                if isinstance(prog, str):
                    api.add(name, expr=prog)
                else:
                    api.add(name, cbpf=prog)
            for name, text in WHERE.items():
                api.add(f"where {name}", where=text)
            api.add("cpu", cbpf=_ld(36, JEQ, cpu0))
            api.add("random", cbpf=_ld(56, JGT, 0x7FFFFFFF))
            r = subprocess.run(ns.exec(sys.executable, "-c", TRAFFIC, tag0.hex(), tag1.hex(), "4242"),
                               capture_output=True, text=True, timeout=120, env=subprocess_env())
            assert r.returncode == 0, r.stderr
            recs = api.drain()
        finally:
            api.close()
    return recs, tag0, tag1


@pytest.mark.parametrize("name", list(FIELDS))
def test_ancillary_field_keeps_what_the_skb_says(api_run, name):
    recs, _, _ = api_run
    everything = recs["all"]
    assert len(everything) > 50, f"{len(everything)} records of the traffic"
    keep = FIELDS[name][1]
    want = [r for r in everything if keep(r)] if keep else recs[f"where {name}"]
    got = recs[name]
    assert Counter(map(_rkey, got)) == Counter(map(_rkey, want)), (
        f"{name}: fcap kept {len(got)}, expected {len(want)} of {len(everything)}")


def test_cpu_field(api_run):
    """The traffic ran pinned to the first CPU, then to the last: `cpu == first` keeps the first part."""
    recs, tag0, tag1 = api_run
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to tell apart")
    want = [r for r in recs["all"] if tag1 not in r.data]
    assert Counter(map(_rkey, recs["cpu"])) == Counter(map(_rkey, want))
    assert any(tag0 in r.data for r in want)


def test_random_field(api_run):
    recs, _, _ = api_run
    n, k = len(recs["all"]), len(recs["random"])
    assert 0.2 * n < k < 0.8 * n, f"random > 2^31 kept {k} of {n}"
    assert Counter(map(_rkey, recs["random"])) - Counter(map(_rkey, recs["all"])) == Counter()


# ---- protochain on live IPv6 traffic with extension headers ------------------------------------------------

SEND6 = r"""
import socket, sys
port = int(sys.argv[1])
r = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); r.bind(("::1", port)); r.settimeout(5)
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
opt = lambda n: bytes([0x1E, n - 2]) + bytes(n - 2)   # an experimental option (RFC 4727) to skip, n bytes
hbh = lambda n: bytes([0, n]) + opt(6) + b"".join(opt(8) for _ in range(n))   # nh (the kernel's), length
for opts in ([], [(41, 54, hbh(0))], [(41, 59, hbh(0))], [(41, 54, hbh(2)), (41, 59, hbh(1))]):
    for level, optname, data in opts:          # IPV6_HOPOPTS = 54, IPV6_DSTOPTS = 59
        s.setsockopt(level, optname, data)
    for n in (10, 1000, 3000):
        s.sendto(bytes([len(opts)]) * n, ("::1", port)); r.recv(65536)
    for level, optname, _ in opts:
        s.setsockopt(level, optname, b"")
"""


def test_protochain_live_matches_tcpdump(tmp_path):
    """IPv6 UDP over lo without and with hop-by-hop and destination options headers (sticky socket options):
    fcap with protochain expressions at net_dev_queue keeps what `tcpdump -r` keeps of fcap's unfiltered
    capture of the same packets."""
    need_root()
    need_tool("tcpdump")
    from filterutil import Captures
    # expression: how many of the 12 datagrams libpcap keeps (none, hop-by-hop, destination options, both)
    exprs = {"ip6 protochain 17": 12, "ip6 protochain 0": 6, "ip6 protochain 60": 6,
             "protochain 17 and not ip6 proto 17": 9, "ip6 protochain 6 or ip6 protochain 58": 0}
    with NetNS("fcapp") as ns:
        specs = {"": ["--netns", str(ns.inum)]} | {e: ["--netns", str(ns.inum), e] for e in exprs}
        with Captures(tmp_path, specs, ext="pcap") as caps:
            r = subprocess.run(ns.exec(sys.executable, "-c", SEND6, "4243"), capture_output=True, text=True,
                               timeout=60, env=subprocess_env())
            assert r.returncode == 0, r.stderr
    everything = read_packets(caps[""].path)
    assert len(everything) == 12, len(everything)   # 4 option sets × 3 sizes, at net_dev_queue
    for e in exprs:
        want = tcpdump_filter(caps[""].path, e, tmp_path / f"ref-{abs(hash(e))}.pcap")
        got = read_packets(caps[e].path)
        diff = multiset_diff(got, want, e)
        assert diff is None, diff
        assert len(want) == exprs[e], (e, len(want))
