"""A live capture's printed lines made a batch at a time (fcap.live.printbatch): from the records the drains lay
out as a pcap file's (LinesWriter: one point, the file rings and the perf buffer alike), and from the records the
loop hands on one by one (Pending: several points, each line naming its point). The lines after the time are
tcpdump -i lo -nn's on the same traffic (TCP connections opened and closed, so the kernel hands skbs out again;
datagrams; pings), in the same order (sent from one CPU); -c stops at its count; and the batches make what the
Printer makes."""

from __future__ import annotations

import io
import os
import random
import socket
import subprocess
import threading
import time

import pytest
from conftest import need_root, need_tool
from filterutil import random_loopback
from netns import Proc, start_fcap

from fcap.files.pcapread import read
from fcap.text.printer import Printer, PrintOptions


def _traffic(addr: str, port: int) -> None:
    """Three TCP connections (a request and an answer each), ten datagrams and two pings to addr, all sent from one
    CPU: lo's receive runs on the sending CPU, so no two packets are sent at once (a client's ACK sent by the
    server's softirq on one CPU and its FIN sent by close() on another reach fcap's point and tcpdump's tap, later in
    the transmit path, in either order)."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        _exchange(addr, port)
    finally:
        os.sched_setaffinity(0, allowed)


def _exchange(addr: str, port: int) -> None:
    srv = socket.socket()
    srv.bind((addr, port))
    srv.listen()

    def serve():
        for _ in range(3):
            c, _ = srv.accept()
            with c:
                c.recv(100)
                c.sendall(b"pong" * 50)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    for i in range(3):
        with socket.create_connection((addr, port)) as c:
            c.sendall(b"ping %d" % i)
            c.recv(1000)
    t.join(5)
    srv.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        for i in range(10):
            u.sendto(b"x" * (i + 1), (addr, port + 1))
    subprocess.run(["ping", "-n", "-c", "2", "-i", "0.2", addr], capture_output=True, timeout=10)


def _lines(text: str) -> list[str]:
    """Each packet's text after its time (-v's lines joined to its first: the packet's after its IP header's, an
    ICMP error's quoted packet)."""
    return [line.split(" ", 1)[1] for line in text.replace("\n    ", "    ").replace("\n\t", "\t").splitlines()
            if line]


@pytest.mark.parametrize("extra", [[], ["--perf-buffer"], ["-v"]], ids=["default", "perf-buffer", "-v"])
def test_lines_are_tcpdumps_on_the_same_traffic(extra, tmp_path):
    """With -v too: the IP headers' fields and the checksums tcpdump finds (TCP's over lo: incorrect, the sum
    left to the device) are fcap's."""
    need_root()
    tcpdump = need_tool("tcpdump")
    rnd = random.Random()
    addr, port = random_loopback(rnd), rnd.randrange(20000, 60000)
    expr = f"host {addr}"
    ours_out, theirs_out = (tmp_path / "fcap.txt").open("w+"), (tmp_path / "tcpdump.txt").open("w+")
    verbose = [f for f in extra if f == "-v"]
    theirs = Proc([tcpdump, "-i", "lo", "-nn", *verbose, "-l", expr], stdout=theirs_out)
    ours = start_fcap(["-i", "tp_btf/net_dev_queue", "-nn", *extra, expr], stdout=ours_out)
    try:
        theirs.wait_for("listening on")
        _traffic(addr, port)
        time.sleep(0.5)
    finally:
        rc = ours.stop()
        theirs.stop()
    assert rc == 0, ours.stderr
    ours_out.seek(0)
    theirs_out.seek(0)
    mine, want = _lines(ours_out.read()), _lines(theirs_out.read())
    assert len(want) >= 3 * 8 + 10 + 4
    # the same lines, in the same order (the traffic is sent from one CPU)
    assert sorted(mine) == sorted(want)
    assert _by_direction(mine) == _by_direction(want)
    assert mine == want
    assert f"{len(mine)} packets captured" in ours.stderr


def _by_direction(lines: list[str]) -> dict:
    """Each direction's lines ("a.p > b.q" before the colon, after -v's header), in their order."""
    out: dict = {}
    for line in lines:
        out.setdefault(line.rsplit(")    ", 1)[-1].split(":", 1)[0], []).append(line)
    return out


def test_count_stops_at_its_line(tmp_path):
    need_root()
    rnd = random.Random()
    addr, port = random_loopback(rnd), rnd.randrange(20000, 60000)
    out = (tmp_path / "fcap.txt").open("w+")
    ours = start_fcap(["-i", "tp_btf/net_dev_queue", "-nn", "-c", "7", f"host {addr}"], stdout=out)
    try:
        _traffic(addr, port)
        assert ours.wait() == 0, ours.stderr
    finally:
        ours.stop()
    out.seek(0)
    assert len(out.read().splitlines()) == 7


def test_two_points_name_theirs_on_each_line(tmp_path):
    """Several points go one record at a time (Pending): each line names its point after the time, a packet
    printed at each of the two points."""
    need_root()
    rnd = random.Random()
    addr, port = random_loopback(rnd), rnd.randrange(20000, 60000)
    out = (tmp_path / "fcap.txt").open("w+")
    ours = start_fcap(["-i", "tp_btf/net_dev_queue", "-i", "tp_btf/netif_receive_skb", "-nn", f"udp and host {addr}"],
                      stdout=out)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            for i in range(5):
                u.sendto(b"y" * (i + 1), (addr, port))
        time.sleep(0.5)
    finally:
        assert ours.stop() == 0, ours.stderr
    out.seek(0)
    lines = _lines(out.read())
    for point in ("tp_btf/net_dev_queue", "tp_btf/netif_receive_skb"):
        mine = [line for line in lines if line.startswith(point + " ")]
        assert [line.split(": ", 1)[1] for line in mine] == [f"UDP, length {i + 1}" for i in range(5)], lines


@pytest.mark.parametrize("options", [PrintOptions(), PrintOptions(verbose=1)], ids=["default", "-v"])
def test_pending_prints_what_the_printer_prints(options):
    """Records of bench.printing's mixed kinds, with and without a point's name, in batches of any size: the same
    text as the Printer's one by one."""
    from bench.printing import write_file
    printbatch = pytest.importorskip("fcap.live.printbatch")
    pytest.importorskip("numpy")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        write_file(f"{d}/m.pcap", 5000)
        recs = list(read(f"{d}/m.pcap"))
    names = ["ip_output", None, "ip_rcv [drop: NO_SOCKET]", "100%"]
    want, got = io.StringIO(), io.StringIO()
    reference, printer = Printer(options, want), Printer(options, got)
    pending = printbatch.Pending(printer, 1)
    rnd = random.Random(7)
    for i, r in enumerate(recs):
        reference.packet(r.ts_ns, r.data, 1, r.orig_len, names[i % 4])
        pending.add(r.ts_ns, r.data, r.orig_len, names[i % 4])
        if rnd.random() < 0.002:
            printer.write_batch(pending.text())
    printer.write_batch(pending.text())
    assert got.getvalue() == want.getvalue()
