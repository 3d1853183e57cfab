"""802.1Q tags the kernel keeps in the skb (offloaded: skb->vlan_tci) rather than in the bytes: EN10MB captures
at a veth carry them in the bytes as `tcpdump -i` shows them (libpcap puts them back from AF_PACKET's auxdata),
byte for byte, and `vlan`, `vlan N` filters see them. The tags come from a VLAN subinterface of each end of the
veth pair (kernels with the 8021q module: the guests), or, where there is none (this host), from a tcx program
that pushes them on each end's way out (bpf_skb_vlan_push, which leaves them offloaded on a veth)."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import need_tool

from netns import read_packets, sh, start_fcap, start_tcpdump, subprocess_env

TX, RX = "tp_btf/net_dev_start_xmit", "tp_btf/netif_receive_skb"
VID, PRIO = 100, 3
TCI = PRIO << 13 | VID

PUSH = r"""
import socket, sys
sys.path[:0] = [sys.argv[1]]
from bpf.asm import R0, R1, R2, R3, R6, call, exit_, mov, movi
from bpf.prog import load
from bpf.sys import LinkCreateAttr, bpf
from bpf.uapi import Cmd, ProgType
items = [mov(R6, R1), movi(R2, 0x0081), movi(R3, int(sys.argv[3])), call(18),   # bpf_skb_vlan_push(skb, 0x8100, tci)
         movi(R0, 0), exit_()]                                                # TCX_PASS
p = load(ProgType.SCHED_CLS, items, name="fcap_vlanpush")
fd = bpf(Cmd.LINK_CREATE, LinkCreateAttr(prog_fd=p.fileno(), target_fd=socket.if_nametoindex(sys.argv[2]),
                                         attach_type=47), "attach tcx egress")   # BPF_TCX_EGRESS
print("ok", flush=True)
sys.stdin.read()
"""

SEND = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 0))
for n in (1, 60, 1000, 1472):
    s.sendto(bytes.fromhex(sys.argv[3]) + bytes(n), (sys.argv[2], 9))
"""


class Tagged:
    """Tagged traffic both ways over the veth pair of `v`: (mode "vlan") VLAN VID subinterfaces on both ends with
    their own /30, or (mode "tcx") tcx programs pushing the tag on both ends, with static neighbours."""

    def __init__(self, v, mode: str):
        self.v, self.mode, self.helpers = v, mode, []
        if mode == "vlan":
            a, b = f"{v.a}.{VID}", f"{v.b}.{VID}"
            # the veth pair's /30 of 198.18.0.0/15, moved to 198.19: the subinterfaces' own
            self.local, self.peer = (x.replace("198.18.", "198.19.", 1) for x in (v.local, v.peer))
            sh("ip", "link", "add", "link", v.a, "name", a, "type", "vlan", "id", str(VID), "egress-qos-map",
               f"0:{PRIO}")
            sh(*v.exec("ip", "link", "add", "link", v.b, "name", b, "type", "vlan", "id", str(VID), "egress-qos-map",
                       f"0:{PRIO}"))
            sh("ip", "addr", "add", f"{self.local}/30", "dev", a)
            sh("ip", "link", "set", a, "up")
            sh(*v.exec("ip", "addr", "add", f"{self.peer}/30", "dev", b))
            sh(*v.exec("ip", "link", "set", b, "up"))
        else:
            self.local, self.peer = v.local, v.peer
            mac_a = Path(f"/sys/class/net/{v.a}/address").read_text().strip()
            mac_b = subprocess.run(v.exec("cat", f"/sys/class/net/{v.b}/address"), capture_output=True,
                                   text=True, check=True).stdout.strip()
            sh("ip", "neigh", "replace", v.peer, "lladdr", mac_b, "dev", v.a, "nud", "permanent")
            sh(*v.exec("ip", "neigh", "replace", v.local, "lladdr", mac_a, "dev", v.b, "nud", "permanent"))
            for argv in ([sys.executable], v.exec(sys.executable)):
                dev = v.a if len(argv) == 1 else v.b
                p = subprocess.Popen([*argv, "-c", PUSH, str(Path(__file__).resolve().parents[1]), dev, str(TCI)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=subprocess_env())
                self.helpers.append(p)
                if p.stdout.readline() != b"ok\n":
                    raise AssertionError(f"tcx vlan push on {dev}: {p.stderr.read().decode()}")

    def send(self, tag: bytes) -> None:
        """UDP datagrams to port 9 from each end to the other, each starting with `tag`."""
        subprocess.run([sys.executable, "-c", SEND, self.local, self.peer, tag.hex()], check=True, timeout=30)
        subprocess.run(self.v.exec(sys.executable, "-c", SEND, self.peer, self.local, tag.hex()), check=True,
                       timeout=30)

    def close(self) -> None:
        for p in self.helpers:
            p.stdin.close()
            p.wait(timeout=10)


def vlan_mode() -> tuple[str | None, str]:
    """("vlan" | "tcx" | None, why not): VLAN devices where the 8021q module loads (or is built in), else tcx."""
    if shutil.which("modprobe"):
        subprocess.run(["modprobe", "8021q"], capture_output=True)
    if os.path.exists("/proc/net/vlan"):
        return "vlan", ""
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    if (major, minor) >= (6, 6):
        return "tcx", ""
    return None, "no 8021q module here and no tcx (6.6+) to push tags with"


def _tagged_ours(pkts, tag: bytes) -> list:
    """The test's datagrams: frames whose UDP payload starts with `tag` (tagged or not)."""
    out = []
    for p in pkts:
        raw = p.raw
        ip = raw[18:] if raw[12:14] == b"\x81\x00" else raw[14:]
        if len(ip) >= 28 and ip[0] >> 4 == 4 and ip[9] == 17 and ip[20 + 8:20 + 8 + len(tag)] == tag:
            out.append(p)
    return out


def _frames(pkts) -> Counter:
    return Counter((p.raw, p.orig_l3_len) for p in pkts)


def test_offloaded_vlan_tags_are_in_the_bytes(veth_ns, tmp_path):
    """fcap at the transmit and the receive tracepoint of the veth (EN10MB) writes the frames `tcpdump -i VETH`
    writes, tag included (TPID 0x8100, priority and VID in the TCI), byte for byte; `vlan VID` keeps them all,
    `vlan VID+1` and `not vlan` none."""
    need_tool("tcpdump")
    mode, why = vlan_mode()
    if mode is None:
        pytest.skip(why)
    v = veth_ns
    tagged = Tagged(v, mode)
    tag = struct.pack(">Q", 0xFCA9_0000_0000 | VID)
    # (--perf-buffer: records through the perf buffer; without: through the file rings, where the kernel has them)
    exprs = {"all": [], "all-perf": ["--perf-buffer"], "vlan": [f"vlan {VID}"],
             "vlan-udp": [f"vlan {VID} and udp port 9"], "other": [f"vlan {VID + 1}"], "untagged": ["not vlan"]}
    try:
        td = start_tcpdump(v.a, tmp_path / "td.pcap")
        caps = {}
        try:
            for n, e in exprs.items():
                caps[n] = start_fcap(["-i", TX, "-i", RX, "--ifname", v.a, "-y", "EN10MB",
                                      "-w", str(tmp_path / f"fc-{n}.pcapng"), *e])
            tagged.send(tag)
        finally:
            for p in [*caps.values(), td]:
                p.stop(signal.SIGINT)
    finally:
        tagged.close()
    want = _tagged_ours(read_packets(tmp_path / "td.pcap"), tag)
    assert len(want) == 8, f"tcpdump saw {len(want)} of the 8 datagrams ({mode})"
    assert all(p.raw[12:16] == struct.pack(">HH", 0x8100, TCI) for p in want), "tcpdump shows no tag: not offloaded?"
    got = _tagged_ours(read_packets(tmp_path / "fc-all.pcapng"), tag)
    assert _frames(got) == _frames(want), (
        f"{mode}: fcap's frames differ from tcpdump's:\n" + "\n".join(p.raw[:20].hex() for p in got[:4]) +
        "\n--\n" + "\n".join(p.raw[:20].hex() for p in want[:4]))
    for n in ("all-perf", "vlan", "vlan-udp"):
        assert _frames(_tagged_ours(read_packets(tmp_path / f"fc-{n}.pcapng"), tag)) == _frames(want), n
    for n in ("other", "untagged"):
        assert not _tagged_ours(read_packets(tmp_path / f"fc-{n}.pcapng"), tag), n

