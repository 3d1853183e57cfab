"""fcap.pcapy: a script written for pcapy-ng, with only its import changed, captures at a kernel point. The same
script runs twice at once on the same pings: with pcapy-ng itself on lo, and with `from fcap import pcapy` at
tp_btf/net_dev_queue (fentry/ip_output in guests that allow it); both dump what they saw with dump_open(), and the
two files hold the same packets, byte for byte (read back by tcpdump; at ip_output, whose link type is LINUX_SLL2,
the same lines). And scapy's sniff() over fcap.scapysock's socket, held to tcpdump on lo."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from conftest import need_root, need_tool, require_kind
from filterutil import random_loopback
from netns import ping, subprocess_env

SCRIPT = r"""
{imp}
import sys
r = pcapy.open_live(sys.argv[1], 65535, 1, 100)
r.setfilter("icmp and host " + sys.argv[3])
d = r.dump_open(sys.argv[2])
print("ready", r.datalink(), flush=True)
seen = []
def got(hdr, data):
    seen.append((hdr.getts(), hdr.getcaplen(), hdr.getlen(), len(data)))
    d.dump(hdr, data)
r.loop(10, got)
d.close()
assert all(c == n == l for _ts, c, n, l in seen), seen
print("done", len(seen), r.stats()[0] >= 10 or sys.argv[1] == "lo", flush=True)
"""


def _start(imp: str, device: str, out, addr: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", SCRIPT.format(imp=imp), device, str(out), addr], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
    line = p.stdout.readline()
    if not line.startswith("ready"):
        p.kill()
        raise AssertionError(f"{device}: {line} {p.stderr.read()[-2000:]}")
    return p


def _packets(path) -> list[str]:
    r = subprocess.run(["tcpdump", "-r", str(path), "-nn", "-x"], capture_output=True, text=True, check=True)
    return [ln.split(" ", 1)[1] for ln in r.stdout.split("\n") if ln and not ln.startswith("\t")], r.stdout


@pytest.mark.parametrize("point", ["tp_btf/net_dev_queue", "fentry/ip_output"])
def test_a_pcapy_script_runs_unchanged_at_a_kernel_point(point, tmp_path):
    need_root()
    need_tool("tcpdump")
    if point.startswith("fentry/"):
        require_kind("fentry")
    addr = random_loopback(random.Random())
    theirs = _start("import pcapy", "lo", tmp_path / "lo.pcap", addr)
    ours = _start("from fcap import pcapy", point, tmp_path / "point.pcap", addr)
    try:
        ping(addr, count=5, interval=0.05)
        out_theirs, err_theirs = theirs.communicate(timeout=60)
        out_ours, err_ours = ours.communicate(timeout=60)
    finally:
        theirs.kill()
        ours.kill()
    assert out_theirs.split() == ["done", "10", "True"], err_theirs
    assert out_ours.split() == ["done", "10", "True"], err_ours
    lines_theirs, hex_theirs = _packets(tmp_path / "lo.pcap")
    lines_ours, hex_ours = _packets(tmp_path / "point.pcap")
    assert len(lines_ours) == 10 and len(lines_theirs) == 10
    # (ip_output's link type is LINUX_SLL2: the same lines after its "?     Out ")
    assert all(o.endswith(t) for o, t in zip(lines_ours, lines_theirs)), (lines_ours, lines_theirs)
    if point.startswith("tp_btf/"):
        assert [h for h in hex_ours.split("\n") if h.startswith("\t")] == \
            [h for h in hex_theirs.split("\n") if h.startswith("\t")]


def test_reader_calls_as_pcapy_gives_them(root):
    from fcap import pcapy
    r = pcapy.open_live("tp_btf/net_dev_queue", 65535, 0, 50)
    try:
        r.setfilter("udp port 1 and host 127.255.255.254")   # nothing matches
        assert r.next() == (None, b"") and r.dispatch(5, lambda h, d: None) == 0
        assert r.datalink() == pcapy.DLT_EN10MB and r.stats() == (0, 0, 0)
        r.setdirection(pcapy.PCAP_D_OUT)
        with pytest.raises(pcapy.PcapError, match="nothing can be sent"):
            r.sendpacket(b"x")
        with pytest.raises(pcapy.PcapError, match="syntax error"):
            r.setfilter("udp port")
    finally:
        r.close()
    with pytest.raises(pcapy.PcapError):
        pcapy.open_live("tp_btf/no_such_tracepoint", 65535, 0, 50)
    assert pcapy.open_offline is not None and pcapy.DLT_RAW == 12   # (the rest: pcapy-ng's own)


@pytest.mark.parametrize("point", ["tp_btf/net_dev_queue", "fentry/ip_output"])
def test_scapy_sniffs_a_kernel_point(point, tmp_path):
    """scapy's sniff() over fcap.scapysock.PointSocket: the 10 packets of 5 pings, as scapy decodes them, the same
    bytes tcpdump captured on lo at the same time (ip_output: their IP layer)."""
    need_root()
    need_tool("tcpdump")
    if point.startswith("fentry/"):
        require_kind("fentry")
    import threading

    from netns import start_tcpdump
    from scapy.all import IP, sniff

    from fcap.files.pcapread import read
    from fcap.scapysock import PointSocket
    addr = random_loopback(random.Random())
    sock = PointSocket(point, filter=f"icmp and host {addr}")
    got: list = []
    t = threading.Thread(target=lambda: got.extend(sniff(opened_socket={sock: point}, count=10, timeout=30)))
    td = start_tcpdump("lo", tmp_path / "lo.pcap", f"icmp and host {addr}")
    try:
        t.start()
        ping(addr, count=5, interval=0.05)
        t.join(40)
    finally:
        sock.close()
        td.stop()
    theirs = [r.data for r in read(tmp_path / "lo.pcap")]
    assert len(got) == 10 and all(p.sniffed_on == point and p.time > 1e9 for p in got), got
    assert [bytes(p[IP]) for p in got] == [bytes(IP(d[14:])) for d in theirs]
    if point.startswith("tp_btf/"):
        assert [bytes(p) for p in got] == theirs
