"""The standard pcapng options fcap writes beside its comment, as Wireshark shows them: epb_queue
(frame.interface_queue) checked against the kernel's own per-queue qdisc counters on a 4-queue veth, epb_verdict
at drop points (frame.verdict.ebpf_tc), epb_packetid (frame.packet_id), epb_flags (frame.packet_flags_direction);
the blocks the capture program lays out (file rings) byte for byte those the writer makes, drop points too."""

from __future__ import annotations

import io
import os
import re
import socket
import struct
import subprocess
import time
from collections import Counter

import pytest
from conftest import need_root

from netns import remove_veth_ns, sh, start_fcap

TC_ACT_SHOT = 2


def _tshark_fields(tshark: str, path, *fields: str, display: str = "") -> list[list[str]]:
    argv = [tshark, "-r", str(path), "-T", "fields", "-E", "separator=|"]
    if display:
        argv += ["-Y", display]
    for f in fields:
        argv += ["-e", f]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [line.split("|") for line in r.stdout.splitlines()]


def _capture(args: list[str], traffic) -> None:
    f = start_fcap(args)
    try:
        traffic()
        time.sleep(0.3)
    finally:
        f.stop()
    assert f.p.returncode == 0, f.stderr


# ---- epb_queue: the transmit queue, as the kernel's qdiscs count them --------------------------------------------

@pytest.fixture
def multiqueue_veth(root):
    """A veth pair with 4 transmit queues and an mq qdisc (one pfifo_fast per queue, each counting its packets)."""
    import random
    from netns import VethNS
    tag = f"{os.getpid() % 100000}{random.randrange(1000):03d}"
    n = random.randrange(1, (1 << 15) // 4 - 1) * 4
    base = (198 << 24) | (18 << 16) | n
    v = VethNS(f"fcapq{tag}", f"fqa{tag}", f"fqb{tag}", socket.inet_ntoa((base + 1).to_bytes(4, "big")),
               socket.inet_ntoa((base + 2).to_bytes(4, "big")))
    try:
        sh("ip", "netns", "add", v.ns)
        sh("ip", "link", "add", v.a, "numtxqueues", "4", "numrxqueues", "4", "type", "veth", "peer", "name", v.b,
           "numtxqueues", "4", "numrxqueues", "4", "netns", v.ns)
        sh("sh", "-c", f"echo 1 > /proc/sys/net/ipv6/conf/{v.a}/disable_ipv6", check=False)
        sh("ip", "addr", "add", f"{v.local}/30", "dev", v.a)
        sh("ip", "link", "set", v.a, "up")
        sh(*v.exec("ip", "addr", "add", f"{v.peer}/30", "dev", v.b))
        sh(*v.exec("ip", "link", "set", v.b, "up"))
        sh("tc", "qdisc", "replace", "dev", v.a, "root", "mq")
        v.a_index = socket.if_nametoindex(v.a)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"arp", (v.peer, 9))
        time.sleep(0.2)
        yield v
    finally:
        remove_veth_ns(v)


def _queue_counts(dev: str) -> Counter:
    """Packets sent by each transmit queue's qdisc (mq's child 8001:N is queue N-1)."""
    out = sh("tc", "-s", "qdisc", "show", "dev", dev).stdout
    counts = Counter()
    for parent, pkts in re.findall(r"parent [0-9a-f]+:([0-9a-f]+) .*?\n\s*Sent \d+ bytes (\d+) pkt", out):
        counts[int(parent, 16) - 1] = int(pkts)
    return counts


def test_queue_matches_the_qdisc_counters(multiqueue_veth, tmp_path, tshark):
    v = multiqueue_veth
    path = tmp_path / "q.pcapng"
    before = _queue_counts(v.a)

    def traffic():
        for port in range(40):        # 40 flows: their hashes spread over the 4 queues
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"q" * port, (v.peer, 20000 + port))
    _capture(["-i", "tp_btf/net_dev_queue", "--ifindex", str(v.a_index), "-w", str(path)], traffic)
    sent = _queue_counts(v.a) - before
    rows = _tshark_fields(tshark, path, "frame.interface_queue", "frame.packet_flags_direction", "frame.packet_id")
    got = Counter(int(q) for q, _, _ in rows)
    assert sum(got.values()) >= 40 and got == sent and len(got) > 1, (got, sent)
    assert all(d == "0x00000002" and int(pid) > 0 for _, d, pid in rows)   # outbound; a packet id each
    assert len({pid for _, _, pid in rows}) == len(rows)   # (one point: every record a packet of its own)


def test_no_queue_where_none_is_meant(tmp_path, tshark, sink):
    """lo's receive side records no queue (no option); a point above the device layer has none."""
    path = tmp_path / "rx.pcapng"

    def traffic():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(3):
                s.sendto(b"r", ("127.0.0.1", sink.port))
    _capture(["-i", "tp_btf/netif_receive_skb", "-i", "tp_btf/net_dev_queue", "-w", str(path),
              f"udp and dst port {sink.port}"], traffic)
    rows = _tshark_fields(tshark, path, "frame.interface_name", "frame.interface_queue")
    assert sorted(rows) == [["tp_btf/net_dev_queue", "0"]] * 3 + [["tp_btf/netif_receive_skb", ""]] * 3


# ---- epb_verdict at drop points, and the program's blocks byte for byte ------------------------------------------

def _drops(port: int, n: int = 6) -> None:
    """UDP datagrams to a port nothing listens on: the kernel drops each (kfree_skb, NO_SOCKET)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(n):
            s.sendto(b"drop%d" % i, ("127.0.0.1", port))


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("path_kind", ["ring", "perf"])
def test_drop_verdict(tmp_path, tshark, path_kind):
    need_root()
    port = _closed_port()
    path = tmp_path / f"drop-{path_kind}.pcapng"
    more = ["--perf-buffer", "-c", "6"] if path_kind == "perf" else []    # user space lays out the blocks
    f = start_fcap(["-i", "tp_btf/kfree_skb", "-w", str(path), *more, f"udp and dst port {port}"])
    try:
        _drops(port)
        if path_kind == "ring":
            time.sleep(0.3)
            f.stop()
        assert f.wait() == 0, f.stderr
    finally:
        f.kill()
    rows = _tshark_fields(tshark, path, "frame.verdict.ebpf_tc", "frame.interface_queue",
                          display="frame.verdict.ebpf_tc == 2")
    assert rows == [[str(TC_ACT_SHOT), ""]] * 6
    from fcap.files.pcapfile import VERDICT_TC
    from fcap.files.pcapread import read
    assert [r.verdict for r in read(path)] == [(VERDICT_TC, TC_ACT_SHOT)] * 6
    _blocks_as_the_writer_makes_them(path)


def _blocks_as_the_writer_makes_them(path) -> None:
    from fcap.files.pcapfile import PcapngWriter
    from fcap.files.pcapread import read
    records = list(read(path))
    data = open(path, "rb").read()
    off = 0
    for _ in range(2):       # the file's own SHB and IDB
        off += struct.unpack_from("=I", data, off + 4)[0]
    buf = io.BytesIO()
    w = PcapngWriter(buf, closefd=False)
    w.add_interface("x", records[0].linktype)
    start = len(buf.getvalue())
    for r in records:
        w.write(r.ts_ns, r.data, r.orig_len, iface=r.iface, flags=r.flags, comment=r.comment, packet_id=r.packet_id,
                queue=r.queue, verdict=r.verdict)
    end = off   # the packets' blocks, then each point's statistics (Interface Statistics Blocks, type 5)
    while end < len(data) and struct.unpack_from("=I", data, end)[0] != 5:
        end += struct.unpack_from("=I", data, end + 4)[0]
    assert buf.getvalue()[start:] == data[off:end]


def test_writer_and_reader_round_trip_queue_and_verdict():
    from fcap.files.pcapfile import VERDICT_HW, VERDICT_TC, VERDICT_XDP, PcapngWriter
    from fcap.files.pcapread import read
    buf = io.BytesIO()
    w = PcapngWriter(buf, closefd=False)
    w.add_interface("p", 1)
    cases = [(None, None), (0, None), (7, (VERDICT_TC, TC_ACT_SHOT)), (None, (VERDICT_XDP, 1)),
             (2**32 - 1, (VERDICT_HW, b"\x01\x02\x03"))]
    for q, v in cases:
        w.write(1, b"\0" * 14, 14, queue=q, verdict=v)
    buf.seek(0)
    assert [(r.queue, r.verdict) for r in read(buf)] == cases


# ---- direction and pkt_type: what the point sees, whatever the link type -------------------------------------------

def _closed_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send(port: int, n: int = 3) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(n):
            s.sendto(b"direction", ("127.0.0.1", port))
            time.sleep(0.02)


@pytest.mark.parametrize("linktype", ["EN10MB", "LINUX_SLL2", "RAW"])
def test_pkt_type_and_direction_do_not_depend_on_the_link_type(tmp_path, tshark, linktype):
    """The same datagram at a transmit and a receive point: the comment's pkt_type and epb_flags say outgoing at
    net_dev_queue and host/inbound at netif_receive_skb for every link type (the skb says PACKET_HOST on transmit;
    the point says outgoing, as AF_PACKET marks what it sees sent)."""
    port = _closed_udp_port()
    out = tmp_path / f"d-{linktype}.pcapng"
    _capture(["-i", "tp_btf/net_dev_queue", "-i", "tp_btf/netif_receive_skb", "-y", linktype, "-w", str(out),
              f"udp and dst port {port}"], lambda: _send(port))
    rows = _tshark_fields(tshark, out, "frame.interface_name", "frame.packet_flags_direction", "frame.comment")
    seen = {}
    for name, direction, comment in rows:
        pkt_type = int(re.search(r" pkt_type=(\d+)", comment).group(1))
        seen.setdefault(name, set()).add((int(direction, 0), pkt_type))
    assert seen == {"tp_btf/net_dev_queue": {(2, 4)}, "tp_btf/netif_receive_skb": {(1, 0)}}, (linktype, seen)


def test_icmp_send_sees_the_packet_it_answers_going_in(tmp_path, tshark):
    """tp_btf/icmp_send sees the received datagram that the port unreachable answers: inbound (epb_flags), its
    bytes the datagram's."""
    port = _closed_udp_port()
    out = tmp_path / "icmp.pcapng"
    try:
        _capture(["-i", "tp_btf/icmp_send", "-w", str(out), f"udp and dst port {port}"], lambda: _send(port))
    except AssertionError as e:
        if "no tracepoint" in str(e):
            pytest.skip("this kernel has no icmp_send tracepoint (Linux 6.8+)")
        raise
    rows = _tshark_fields(tshark, out, "frame.packet_flags_direction", "udp.dstport")
    assert rows and all(int(d, 0) == 1 and int(p) == port for d, p in rows), rows
