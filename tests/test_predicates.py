"""In-kernel predicates on live traffic: --pid, --comm, --mark, --ifname, --ifindex, --netns and --where (member
chains, strings, bitfields, enums by name, signed fields, '&', several ANDed), a predicate composed with a
filter, and every error as one line.

Each test starts several captures at once, each with one predicate, over the same traffic, and checks (a) which
of the test's own packets each kept — exactly the expected groups, every packet of them — and (b) for every packet
kept (other traffic too) what the predicate promises, from the comment fcap writes with each packet."""

from __future__ import annotations

import os
import random
import socket
import subprocess
from collections import Counter

import pytest
from conftest import need_root, require_kind

from filterutil import POINT, Captures, NetNS, Sender, meta, random_loopback
from netns import Peer, flow_of, read_packets, run_fcap

ETH = 14


def _groups(path, classify) -> tuple[Counter, list]:
    """(how many packets of each of the test's groups the capture holds, every packet)."""
    pkts = read_packets(path)
    return Counter(g for g in map(classify, pkts) if g is not None), pkts


# ---- lo: pid, comm, mark, --where over skb fields ----------------------------------------------------------

@pytest.fixture(scope="module")
def lo_run(tmp_path_factory):
    need_root()
    rnd = random.Random()
    a = random_loopback(rnd)
    name = f"fct{rnd.randrange(16 ** 8):08x}"          # 11 characters: a comm of our own
    # non-ASCII names: compared by their UTF-8 bytes, whole (not a prefix), also where a 4-byte piece of the
    # comparison has its top bit set ("ab\xc3\xa9" = 0xa9c36261 > 2**31: a sign-extended imm32 never equals it)
    wide = f"fcé{rnd.randrange(16 ** 4):04x}z"           # 9 characters, 10 bytes
    high = f"fc{rnd.randrange(16 ** 6):06x}abé"           # 11 characters, 12 bytes: pieces of 8, 4 (+ NUL)
    m1 = 0x4100 | rnd.randrange(0x100)                  # bit 0x100 set
    m2 = 0x8200 | rnd.randrange(0x100)                  # bit 0x100 clear
    port = 9                     # discard: nothing listens in the namespace, the datagrams go out all the same
    senders = {}
    ns = NetNS()
    n = ["--netns", str(ns.inum)]   # for captures that would keep other traffic on the machine too
    try:
        senders = {
            "plain": Sender(a, port, count=5, size=64, ns=ns),
            "named": Sender(a, port, count=4, size=1500, comm=name, ns=ns),
            "marked": Sender(a, port, count=3, size=64, mark=m1, ns=ns),
            "marked2": Sender(a, port, count=2, size=2000, mark=m2, ns=ns),
            "wide": Sender(a, port, count=2, size=64, comm=wide, ns=ns),
            "high": Sender(a, port, count=2, size=64, comm=high, ns=ns),
            "six": Sender("::1", port, count=3, size=100, ns=ns),
        }
        s = senders
        specs = {
            "all": n,
            "pid": ["--pid", str(s["plain"].pid)],
            "comm": ["--comm", name],
            "comm_prefix": ["--comm", name[:-1]],
            "comm_wide": ["--comm", wide],
            "comm_wide_prefix": ["--comm", wide[:-1]],        # 8 characters, 9 bytes: a prefix of the name
            "comm_high": ["--comm", high],
            "dev_prefix": ["--where", 'skb->dev->name == "l"'],
            "mark": ["--mark", str(m1)],
            "mark_hex": ["--mark", hex(m2)],
            "len": [*n, "--where", "skb->len > 1000"],
            "len_ge": [*n, "--where", f"skb->len >= {ETH + 28 + 2000}"],           # marked2 exactly
            "range": [*n, "--where", f"skb->len > {ETH + 28 + 64}", "--where", f"skb->len <= {ETH + 28 + 1500}"],
            "ne": [*n, "--where", f"skb->len != {ETH + 28 + 64}"],
            "markbit": ["--where", "skb->mark & 0x100"],
            "family": [*n, "--where", "skb->sk->__sk_common.skc_family == 10"],
            "proto_be": [*n, "--where", "skb->protocol == 0x86dd"],
            "proto_le": ["--where", "skb->protocol == 0xdd86"],
            "signed": [*n, "--where", "skb->sk->sk_sndbuf > -1"],
            "sk_mark": ["--where", f"skb->sk->sk_mark == {m2}"],
            "pid_comm": ["--pid", str(s["named"].pid), "--comm", name],
            "pid_comm_none": ["--pid", str(s["plain"].pid), "--comm", name],
            "compose": ["--where", "skb->len > 1000",
                        f"udp src port {s['marked2'].port} or udp src port {s['plain'].port}"],
        }
        d = tmp_path_factory.mktemp("pred-lo")
        with Captures(d, {k: ["-B", "512", *v] for k, v in specs.items()}) as caps:
            for snd in senders.values():
                snd.send()
    finally:
        for x in senders.values():
            x.close()
        ns.close()

    def classify(p):
        for g, snd in senders.items():
            if snd.mine(p):
                return g
        return None

    counts = {g: x.count for g, x in senders.items()}
    return {"caps": caps, "classify": classify, "senders": senders, "counts": counts, "name": name, "wide": wide,
            "high": high, "m1": m1, "m2": m2}


def _expect(run, cap: str, groups: set[str]) -> list:
    got, pkts = _groups(run["caps"][cap].path, run["classify"])
    want = Counter({g: run["counts"][g] for g in groups})
    assert got == want, f"{cap} {run['caps'][cap].args[3:]}: kept {dict(got)} of the test's packets, expected " \
                        f"{dict(want)}"
    return pkts


def test_lo_traffic_as_captured_without_predicates(lo_run):
    """The premise: every sender's datagrams went out on lo with the pid, comm, mark and length meant."""
    pkts = _expect(lo_run, "all", {"plain", "named", "marked", "marked2", "wide", "high", "six"})
    s = lo_run["senders"]
    for p in pkts:
        g = lo_run["classify"](p)
        if g is None:
            continue
        m = meta(p)
        assert m["pid"] == s[g].pid, (g, m)
        assert (m["comm"] == lo_run["name"]) == (g == "named"), (g, m)
        assert (m["comm"] == lo_run["wide"]) == (g == "wide"), (g, m)
        assert (m["comm"] == lo_run["high"]) == (g == "high"), (g, m)
        assert m["mark"] == {"marked": lo_run["m1"], "marked2": lo_run["m2"]}.get(g, 0), (g, m)
        assert m["len"] == p.orig_l3_len + ETH, (g, m)


def test_pid(lo_run):
    pkts = _expect(lo_run, "pid", {"plain"})
    assert {meta(p)["pid"] for p in pkts} == {lo_run["senders"]["plain"].pid}


def test_comm(lo_run):
    pkts = _expect(lo_run, "comm", {"named"})
    assert {meta(p)["comm"] for p in pkts} == {lo_run["name"]}


def test_names_compare_whole(lo_run):
    """A name given to --comm or compared with --where is the whole string, not a prefix, also when it is
    longer in bytes than in characters."""
    _expect(lo_run, "comm_prefix", set())
    _expect(lo_run, "dev_prefix", set())
    _expect(lo_run, "comm_wide", {"wide"})
    _expect(lo_run, "comm_wide_prefix", set())
    _expect(lo_run, "comm_high", {"high"})


def test_mark(lo_run):
    pkts = _expect(lo_run, "mark", {"marked"})
    assert {meta(p)["mark"] for p in pkts} == {lo_run["m1"]}
    pkts = _expect(lo_run, "mark_hex", {"marked2"})
    assert {meta(p)["mark"] for p in pkts} == {lo_run["m2"]}


def test_where_length_compare(lo_run):
    assert all(meta(p)["len"] > 1000 for p in _expect(lo_run, "len", {"named", "marked2"}))
    assert all(meta(p)["len"] >= 2042 for p in _expect(lo_run, "len_ge", {"marked2"}))


def test_where_several_are_anded(lo_run):
    """'> 106' and '<= 1542', exactly the lengths of two groups: the 106-byte ones out, the 1542-byte in."""
    assert all(106 < meta(p)["len"] <= 1542 for p in _expect(lo_run, "range", {"named", "six"}))


def test_where_not_equal(lo_run):
    assert all(meta(p)["len"] != ETH + 28 + 64 for p in _expect(lo_run, "ne", {"named", "marked2", "six"}))


def test_where_bit_and(lo_run):
    assert all(meta(p)["mark"] & 0x100 for p in _expect(lo_run, "markbit", {"marked"}))


def test_where_member_chain_through_pointer_and_struct(lo_run):
    """skb->sk->__sk_common.skc_family: '->' through a pointer, '.' into an embedded struct."""
    _expect(lo_run, "family", {"six"})
    _expect(lo_run, "sk_mark", {"marked2"})


def test_where_signed_field(lo_run):
    """sk_sndbuf is an int: '> -1' is a signed compare and keeps every packet with a socket."""
    _expect(lo_run, "signed", {"plain", "named", "marked", "marked2", "wide", "high", "six"})


def test_where_protocol_byte_order(lo_run):
    """skb->protocol is __be16: --where compares it in host order, as users write it (ETH_P_IPV6 = 0x86dd);
    the byte-swapped 0xdd86 matches nothing."""
    pkts = _expect(lo_run, "proto_be", {"six"})
    assert {meta(p)["proto"] for p in pkts} == {0x86DD}
    _expect(lo_run, "proto_le", set())


def test_pid_and_comm_together(lo_run):
    _expect(lo_run, "pid_comm", {"named"})
    _expect(lo_run, "pid_comm_none", set())


def test_predicate_and_filter_keep_the_intersection(lo_run):
    """--where keeps named + marked2 (long), the filter plain + marked2 (their ports): together marked2 only."""
    _expect(lo_run, "compose", {"marked2"})


# ---- a veth pair into a namespace: ifname, ifindex, netns, strings, pkt_type --------------------------------

def _classifier(v, port: int, peer_port: int, bport: int, local):
    """Which of the test's groups a packet belongs to: req, rep, bcast, lo (None: another's)."""
    def classify(p):
        f = flow_of(p)
        if f is None or f.proto != 17:
            return None
        groups = {(v.local, v.peer, port, peer_port): "req", (v.peer, v.local, peer_port, port): "rep"}
        if (f.src, f.dst, f.sport, f.dport) in groups:
            return groups[(f.src, f.dst, f.sport, f.dport)]
        if (f.src, f.dst, f.sport) == (v.local, "255.255.255.255", bport):
            return "bcast"
        return "lo" if local.mine(p) else None
    return classify


def test_device_and_namespace_predicates(veth_ns, tmp_path):
    """veth a (this namespace) <-> b (namespace N): UDP echo requests go out a and come in on b, replies the
    other way, broadcasts (255.255.255.255 out of a) come in on b as PACKET_BROADCAST, and a sender inside N
    talks over N's lo. Captures that would keep the machine's own lo traffic exclude it with a predicate."""
    v = veth_ns
    inum = os.stat(f"/run/netns/{v.ns}").st_ino
    root_inum = os.stat("/proc/self/ns/net").st_ino
    b_index = int(subprocess.run(v.exec("cat", f"/sys/class/net/{v.b}/ifindex"), capture_output=True, text=True,
                                 check=True).stdout)
    peer = Peer(v, 1000, 1)
    local = Sender("127.0.0.1", 9, count=4, size=400, ns=v)
    rx = "tp_btf/netif_receive_skb"
    # a filter keeps captures that would see other veth traffic on the machine (a benchmark's) to this pair's
    not_lo = ["--where", 'skb->dev->name != "lo"', f"host {v.local}"]
    specs = {
        "not_lo": not_lo,
        "ns": ["--netns", str(inum)],
        "lo": ["--netns", str(inum), "--where", 'skb->dev->name == "lo"'],
        "ifname_a": ["--ifname", v.a],
        "ifindex_a": ["--ifindex", str(v.a_index), f"host {v.local}"],
        "ifname_b": ["--ifname", v.b],
        "rx_not_lo": ["-i", rx, *not_lo],
        "rx_netns": ["-i", rx, "--netns", str(inum)],
        "rx_bcast": ["-i", rx, "--where", "skb->pkt_type == 1", f"host {v.local}"],
        "rx_host": ["-i", rx, "--where", "skb->pkt_type == 0", "--ifname", v.b],
    }
    try:
        with Captures(tmp_path, {k: ["-B", "512", *x] for k, x in specs.items()}) as caps:
            port = peer.udp_echo(v.peer, [os.urandom(200) for _ in range(3)])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, v.a.encode())
                s.bind((v.local, 0))
                bport = s.getsockname()[1]
                for _ in range(2):
                    s.sendto(os.urandom(300), ("255.255.255.255", 9))
            local.send()
    finally:
        peer.close()
        local.close()

    classify = _classifier(v, port, peer.udp_port, bport, local)
    n = {"req": 3, "rep": 3, "bcast": 2, "lo": 4}

    def expect(cap: str, groups: set[str]) -> list:
        got, pkts = _groups(caps[cap].path, classify)
        want = Counter({g: n[g] for g in groups})
        assert got == want, f"{cap} {caps[cap].args[3:]}: kept {dict(got)}, expected {dict(want)}"
        return pkts

    # the premise: where each packet was, as fcap's metadata has it
    for p in expect("not_lo", {"req", "rep", "bcast"}) + expect("ns", {"rep", "lo"}):
        g, m = classify(p), meta(p)
        want = {"req": (v.a_index, root_inum), "bcast": (v.a_index, root_inum), "rep": (b_index, inum),
                "lo": (1, inum)}.get(g)
        assert want is None or (m["ifindex"], m["netns"]) == want, (g, m)
    for p in expect("rx_not_lo", {"req", "rep", "bcast"}):
        if classify(p) == "bcast":
            assert p.raw[:6] == b"\xff" * 6 and meta(p)["pkt_type"] == 1, (p.raw[:14].hex(), meta(p))
    # --ifname / --ifindex (ifindex is per namespace: the peer's may be the same number)
    expect("ifname_a", {"req", "bcast"})
    expect("ifname_b", {"rep"})
    for p in expect("ifindex_a", {"req", "bcast"} | ({"rep"} if b_index == v.a_index else set())):
        assert meta(p)["ifindex"] == v.a_index
    # --netns: sent inside the namespace (net_dev_queue: the replies, lo), received inside it (netif_receive_skb)
    for p in expect("rx_netns", {"req", "bcast", "lo"}):
        assert meta(p)["netns"] == inum
    # --where on a string, the device's name; with --netns
    for p in expect("lo", {"lo"}):
        assert (meta(p)["ifindex"], meta(p)["netns"]) == (1, inum)
    # --where on a bitfield (pkt_type: 3 bits): PACKET_BROADCAST = 1, PACKET_HOST = 0
    for p in expect("rx_bcast", {"bcast"}):
        assert p.raw[:6] == b"\xff" * 6, f"pkt_type 1 but destination {p.raw[:6].hex()}"
    expect("rx_host", {"req"})


def test_queue_keeps_one_device_queue(tmp_path, root):
    """--queue N (a selector added as one unit: fcap.features.selectors): a veth with 4 transmit queues spreads 40
    UDP flows over them; the capture with --queue 2 holds exactly the packets the capture without it recorded on
    queue 2 (epb_queue: frame.interface_queue, held to tshark and the qdiscs' counters by test_epbopts), and some
    went to other queues."""
    from fcap.files.pcapread import read

    def rows(path) -> list:   # (queue, UDP source port) per packet
        return [(r.queue, int.from_bytes(r.data[34:36], "big")) for r in read(path)]
    tag = f"{os.getpid() % 100000}{random.randrange(1000):03d}"
    ns, a, b = f"fcapq{tag}", f"fqa{tag}", f"fqb{tag}"
    n = random.randrange(1, (1 << 15) // 4 - 1) * 4
    local, peer = (socket.inet_ntoa((((198 << 24) | (18 << 16) | n) + k).to_bytes(4, "big")) for k in (1, 2))
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True)   # noqa: E731
    try:
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", a, "numtxqueues", "4", "numrxqueues", "4", "type", "veth", "peer", "name", b,
            "netns", ns)
        run("sh", "-c", f"echo 1 > /proc/sys/net/ipv6/conf/{a}/disable_ipv6")
        run("ip", "addr", "add", f"{local}/30", "dev", a)
        run("ip", "link", "set", a, "up")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{peer}/30", "dev", b)
        run("ip", "netns", "exec", ns, "ip", "link", "set", b, "up")
        point = "tp_btf/net_dev_start_xmit"
        with Captures(tmp_path, {"all": ["-i", point, "--ifname", a, "udp port 9"],
                                 "q2": ["-i", point, "--ifname", a, "--queue", "2", "udp port 9"]}) as caps:
            for i in range(40):
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.bind((local, 0))
                    s.sendto(bytes(64), (peer, 9))
        every = rows(caps["all"].path)
        queues = Counter(q for q, _port in every)
        on_q2 = sorted(port for q, port in every if q == 2)
        assert len(every) >= 40 and len(queues) > 1 and on_q2, queues
        got = rows(caps["q2"].path)
        assert sorted(port for _q, port in got) == on_q2 and {q for q, _p in got} == {2}, (queues, got)
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ---- an enum by name: the drop reason at tp_btf/kfree_skb ---------------------------------------------------

def _drop_reason_arg() -> tuple[str, dict]:
    from fcap.points.spec import resolve
    p = resolve("tp_btf/kfree_skb")
    for prm in p.params:
        t = prm.type.strip()
        if getattr(t, "values", None) and "SKB_DROP_REASON_NO_SOCKET" in t.values:
            return prm.name, t.values
    pytest.skip("tp_btf/kfree_skb has no enum skb_drop_reason argument on this kernel")


DROPS = r"""
import socket, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as t:
    t.bind(("127.0.0.1", 0))
    closed = t.getsockname()[1]
full = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
full.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
full.bind(("127.0.0.1", 0))
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.bind(("127.0.0.1", 0))
b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], closed, b.getsockname()[1], full.getsockname()[1], flush=True)
sys.stdin.readline()
for _ in range(3):
    a.sendto(bytes(100), ("127.0.0.1", closed))
for _ in range(20):
    b.sendto(bytes(1000), ("127.0.0.1", full.getsockname()[1]))
print("sent", flush=True)
"""


def test_where_enum_by_name(tmp_path, root):
    """At tp_btf/kfree_skb, 'REASON == SKB_DROP_REASON_NO_SOCKET' keeps the datagrams sent to a closed port,
    'REASON == SKB_DROP_REASON_SOCKET_RCVBUFF' those dropped by a full socket, each not the other's; the
    enum's value as a number does what its name does. (In a namespace of the test's own: --netns.)"""
    import sys
    arg, values = _drop_reason_arg()
    if "SKB_DROP_REASON_SOCKET_RCVBUFF" not in values:
        pytest.skip("this kernel's enum skb_drop_reason has no SKB_DROP_REASON_SOCKET_RCVBUFF")
    with NetNS() as ns:
        proc = subprocess.Popen(ns.exec(sys.executable, "-c", DROPS), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        try:
            p1, closed, p2, fport = map(int, proc.stdout.readline().split())
            point = ["-i", "tp_btf/kfree_skb", "-B", "512", "--netns", str(ns.inum)]
            specs = {"all": point, "nosock": point + ["--where", f"{arg} == SKB_DROP_REASON_NO_SOCKET"],
                     "rcvbuf": point + ["--where", f"{arg} == SKB_DROP_REASON_SOCKET_RCVBUFF"],
                     "number": point + ["--where", f"{arg} == {values['SKB_DROP_REASON_NO_SOCKET']}"]}
            with Captures(tmp_path, specs) as caps:
                proc.stdin.write("go\n")
                proc.stdin.flush()
                assert proc.stdout.readline() == "sent\n"
        finally:
            proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()

    def classify(p):
        f = flow_of(p)
        if f is None or f.proto != 17:
            return None
        return {(p1, closed): "closed", (p2, fport): "full"}.get((f.sport, f.dport))

    got_all, _ = _groups(caps["all"].path, classify)
    assert got_all["closed"] == 3, f"the closed port's datagrams were not all dropped: {dict(got_all)}"
    assert got_all["full"] >= 1, f"the full socket dropped nothing: {dict(got_all)}"
    for cap, want in (("nosock", {"closed": 3}), ("number", {"closed": 3}), ("rcvbuf", {"full": got_all["full"]})):
        got, _ = _groups(caps[cap].path, classify)
        assert got == Counter(want), f"{cap}: kept {dict(got)}, expected {want}"


# ---- fexit: the return value and arguments by name (kernels that allow trampolines: the VM tier) ------------

def test_where_return_and_arguments_at_fexit(tmp_path):
    """At fexit/__ip_local_out (int __ip_local_out(struct net *net, struct sock *sk, struct sk_buff *skb)),
    which returns 1 when netfilter lets the packet on: 'return == 1' keeps every datagram sent, 'return != 1'
    none; 'sk->sk_mark == M' (an argument other than the skb, by name) only the marked socket's. (--comm keeps
    the captures to the test's senders: --netns needs skb->dev, which is not set yet at this point.)"""
    require_kind("fexit", "__ip_local_out")
    mark = 0x5100 | random.randrange(0x100)
    comm = f"fcr{random.randrange(16 ** 8):08x}"
    with NetNS() as ns:
        plain = Sender("127.0.0.1", 9, count=3, size=64, comm=comm, ns=ns)
        marked = Sender("127.0.0.1", 9, count=2, size=64, comm=comm, mark=mark, ns=ns)
        try:
            point = ["-i", "fexit/__ip_local_out", "-B", "512", "--comm", comm]
            specs = {"ret1": point + ["--where", "return == 1"], "ret_not1": point + ["--where", "return != 1"],
                     "sk": point + ["--where", f"sk->sk_mark == {mark}"]}
            with Captures(tmp_path, specs) as caps:
                plain.send()
                marked.send()
        finally:
            plain.close()
            marked.close()

    def classify(p):
        return "plain" if plain.mine(p) else "marked" if marked.mine(p) else None

    for cap, want in (("ret1", {"plain": 3, "marked": 2}), ("ret_not1", {}), ("sk", {"marked": 2})):
        got, _ = _groups(caps[cap].path, classify)
        assert got == Counter(want), f"{cap} {caps[cap].args[3:]}: kept {dict(got)}, expected {want}"


# ---- errors: one line each, naming the path ------------------------------------------------------------------

@pytest.mark.parametrize("where, words", [
    ("skb->nope == 1", ["skb->nope", "no member 'nope'"]),
    ("skb->len->x == 1", ["skb->len->x", "not a pointer"]),
    ('skb->dev.name == "lo"', ["skb->dev.name", "is a pointer: use ->"]),
    ("skb.len > 1", ["skb.len", "is a pointer"]),
    ("skb->len = 3", ["skb->len = 3", "expected PATH OP VALUE"]),
    ("skb->len ~ 3", ["skb->len ~ 3", "expected PATH OP VALUE"]),
    ("skb->len", ["skb->len", "expected PATH OP VALUE"]),
    ('skb->len == "lo"', ["skb->len", "not a number"]),
    ("skb->len > 12abc", ["skb->len", "'12abc' is not a number"]),
    ('skb->dev->name < "lo"', ["skb->dev->name", "== or != only"]),
    ('skb->dev->name == "0123456789abcdefXYZ"', ["skb->dev->name", "longer than 15 bytes"]),
    ("skb->dev->stats == 0", ["skb->dev->stats", "cannot compare"]),
    ("return == 0", ["return", "only at fexit"]),
    ("foo->len > 1", ["foo->len", "no argument 'foo'", "arguments: skb"]),
])
def test_where_errors_are_one_line(where, words, tmp_path, root):
    r = run_fcap(["-i", POINT, "--where", where, "-w", str(tmp_path / "x.pcap")], timeout=60)
    err = r.stderr.decode()
    assert r.returncode != 0, f"--where {where!r} was accepted: {err}"
    assert "Traceback" not in err and "listening on" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fcap: --where "), err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


@pytest.mark.parametrize("args, words", [
    (["-i", "tp_btf/kfree_skb", "--where", "{reason} == SKB_DROP_REASON_NOPE"],
     ["fcap: --where {reason}", "no enum skb_drop_reason value called 'SKB_DROP_REASON_NOPE'", "did you mean"]),
    (["-i", "tp_btf/kfree_skb", "--where", "{reason} == NO_SOCKETS"],
     ["fcap: --where {reason}", "'NO_SOCKETS'", "did you mean NO_SOCKET"]),
    (["-i", POINT, "--comm", "0123456789abcdefg"], ["fcap: --comm", "longer than 15 bytes"]),
    (["-i", POINT, "--ifname", "0123456789abcdefg"], ["fcap: --ifname", "longer than 15 bytes"]),
    (["-i", POINT, "--pid", "12ab"], ["fcap: invalid pid '12ab'", "not a number"]),
    (["-i", POINT, "--mark", "x"], ["fcap: invalid mark 'x'"]),
    (["-i", POINT, "--ifindex", "0"], ["fcap: invalid ifindex '0'"]),
    (["-i", "tp_btf/kfree_skb", "--queue", "0"], ["fcap: --queue: tp_btf/kfree_skb has no device queue"]),
    (["-i", POINT, "--queue", "-1"], ["fcap: invalid queue '-1'"]),
])
def test_predicate_flag_errors_are_one_line(args, words, tmp_path, root):
    if any("{reason}" in a for a in args):
        reason, _ = _drop_reason_arg()
        args = [a.replace("{reason}", reason) for a in args]
        words = [w.replace("{reason}", reason) for w in words]
    r = run_fcap([*args, "-w", str(tmp_path / "x.pcap")], timeout=60)
    err = r.stderr.decode()
    assert r.returncode != 0, err
    assert "Traceback" not in err and "listening on" not in err, err
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"
