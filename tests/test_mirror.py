"""--mirror NAME: a kernel point as an interface any libpcap program opens. tcpdump -i NAME and tshark -i NAME each
capture the pings fcap captured at tp_btf/net_dev_queue, the same bytes tcpdump -i lo captured (raw IP: a TUN
device); fcap does not capture its own mirror (its count stays at the pings'); nothing entered a network stack (the
device received nothing: its rx counter, its neighbour table); the device goes away with fcap, killed too."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
from conftest import need_root, need_tool
from filterutil import random_loopback
from netns import Proc, ping, run_fcap, start_fcap, start_tcpdump

from fcap.files.pcapread import read


def _name() -> str:
    return f"fcm{os.getpid() % 10000}{random.randrange(100):02d}"


def _stat(name: str, what: str) -> int:
    with open(f"/sys/class/net/{name}/statistics/{what}") as f:
        return int(f.read())


def _gone(name: str, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while os.path.exists(f"/sys/class/net/{name}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("linktype", ["EN10MB", "RAW"])
def test_tcpdump_and_tshark_capture_the_mirror(linktype, tmp_path):
    need_root()
    need_tool("tcpdump")
    tshark = need_tool("tshark")
    name, addr = _name(), random_loopback(random.Random())
    flt = f"icmp and host {addr}"
    fcap = start_fcap(["-i", "tp_btf/net_dev_queue", "-y", linktype, "--mirror", name, flt])
    taps = []
    try:
        flags = subprocess.run(["ip", "-o", "link", "show", name], capture_output=True, text=True).stdout
        assert "NOARP" in flags and "UP" in flags, flags
        lo = start_tcpdump("lo", tmp_path / "lo.pcap", flt)
        taps.append(lo)
        mirrored = start_tcpdump(name, tmp_path / "mirror.pcap", "-c", "10", "icmp")
        taps.append(mirrored)
        ts = Proc([tshark, "-i", name, "-c", "10", "-w", str(tmp_path / "tshark.pcapng"), "icmp"], name="tshark")
        taps.append(ts)
        ts.wait_for(r"Capturing on")
        time.sleep(0.5)
        ping(addr, count=5, interval=0.05)
        assert mirrored.wait(20) == 0 and ts.wait(20) == 0, mirrored.stderr + ts.stderr
        assert _stat(name, "rx_packets") == 0 and _stat(name, "tx_packets") >= 10
        neigh = subprocess.run(["ip", "neigh", "show", "dev", name], capture_output=True, text=True).stdout
        assert not neigh.strip(), neigh
        lo.stop()
    finally:
        for t in taps:
            t.stop()
        rc = fcap.stop()
    assert rc == 0 and "10 packets captured" in fcap.stderr and "10 packets received by filter" in fcap.stderr, \
        fcap.stderr   # (no more: its own mirror's packets went by net_dev_queue too, and were left out)
    want = [r.data if linktype == "EN10MB" else r.data[14:] for r in read(tmp_path / "lo.pcap")]
    assert len(want) == 10
    assert [r.data for r in read(tmp_path / "mirror.pcap")] == want
    assert [r.data for r in read(tmp_path / "tshark.pcapng")] == want
    assert _gone(name)


def test_a_killed_capture_leaves_no_interface(root):
    name = _name()
    fcap = start_fcap(["-i", "tp_btf/net_dev_queue", "--mirror", name, "icmp and host 127.255.255.254"])
    try:
        assert os.path.exists(f"/sys/class/net/{name}")
        fcap.stop(signal.SIGKILL)
    finally:
        fcap.kill()
    assert _gone(name)


@pytest.mark.parametrize("args, words", [
    (["--mirror", "lo"], "--mirror lo: an interface of that name exists"),
    (["--mirror", "fcmx", "-w", "x.pcap"], "--mirror: the packets go to the interface"),
    (["--mirror", "a-name-far-too-long"], "an interface name of 1 to 15 bytes"),
])
def test_mirror_errors_are_one_line(args, words, root, tmp_path):
    r = run_fcap(["-i", "tp_btf/net_dev_queue", *args], cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode != 0 and len(err.splitlines()) == 1 and words in err, err
