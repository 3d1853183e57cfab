"""fcap as a Wireshark extcap, with the real tshark: the interface protocol's answers, --install/--uninstall into
the personal extcap folder of a HOME made for the test (tshark -D lists fcap's interfaces), and captures that
tshark starts (-i fcap-dev-queue -c N -w FILE; the any-point interface configured with -o)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time

import pytest
from conftest import need_root, need_tool

from netns import SLOW, Stream, run_fcap, subprocess_env


def _extcap(*args: str) -> subprocess.CompletedProcess:
    return run_fcap(["extcap", *args])


@pytest.fixture
def home(tmp_path, tshark):
    """A HOME of the test's own, with fcap's launcher installed into its Wireshark extcap folder."""
    env = subprocess_env()
    env["HOME"] = str(tmp_path)
    env.pop("XDG_CONFIG_HOME", None)
    r = run_fcap(["extcap", "--install"], env=env)
    assert r.returncode == 0, r.stderr
    return env


def _tshark(tshark: str, env: dict, *args: str, timeout: float = 120 * SLOW) -> subprocess.CompletedProcess:
    return subprocess.run([tshark, *args], capture_output=True, text=True, env=env, timeout=timeout)


# ---- the protocol ------------------------------------------------------------------------------------------

def test_interfaces_dlts_config():
    r = _extcap("--extcap-interfaces", "--extcap-version=4.0")
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 0 and lines[0].startswith("extcap {version=")
    names = re.findall(r"^interface \{value=([^}]+)\}\{display=fcap: ", r.stdout.decode(), re.M)
    # one interface per semantic point, as `fcap -i` names them, and the configurable one
    assert names == ["fcap-dev-queue", "fcap-dev-xmit", "fcap-dev-receive", "fcap-ip-send", "fcap-ip-receive",
                     "fcap-ip6-send", "fcap-ip6-receive", "fcap-tcp-send", "fcap-tcp-receive", "fcap-tcp-retransmit",
                     "fcap-udp-send", "fcap-udp-receive", "fcap-skb-drop", "fcap-skb-consume", "fcap-any"]
    assert "interface {value=fcap-skb-drop}{display=fcap: skb:drop, a packet dropped" in r.stdout.decode()
    assert _extcap("--extcap-interface", "fcap-dev-queue", "--extcap-dlts").stdout.decode() == \
        "dlt {number=1}{name=fcap-dev-queue}{display=Ethernet}\n"
    for iface in ("fcap-skb-drop", "fcap-tcp-receive"):
        assert _extcap(f"--extcap-interface={iface}", "--extcap-dlts").stdout.decode().startswith(
            f"dlt {{number=276}}{{name={iface}}}")
    # the tracepoint interfaces of earlier versions still answer (a saved Wireshark profile may name them)
    assert _extcap("--extcap-interface", "fcap-net_dev_queue", "--extcap-dlts").stdout.decode() == \
        "dlt {number=1}{name=fcap-net_dev_queue}{display=Ethernet}\n"
    config = _extcap("--extcap-interface", "fcap-any", "--extcap-config").stdout.decode().splitlines()
    from fcap.features import FLAGGED
    units = [w for f in FLAGGED for w in [f.flag] + [s.flag for s in f.shorthands + f.settings]]   # (a field each)
    assert units[:3] == ["--context", "--nft", "--nft-netns"] and "--stack" in units
    assert units[3:5] == ["--dump", "--ct"]
    assert [re.search(r"\{call=([^}]+)\}", c)[1] for c in config] == ["--point", "--snaplen", "--where"] + units
    assert "{required=true}" in config[0]
    assert "{call=--context}{display=Context (--context)}{type=boolflag}{default=false}{tooltip=record " in \
        config[3]
    assert "{call=--dump}{display=Dumps (PATH)}{type=string}" in config[6]
    assert "{call=--ct}{display=Conntrack entry (--ct)}{type=boolflag}{default=false}" in config[7]
    fixed = _extcap("--extcap-interface", "fcap-dev-queue", "--extcap-config").stdout.decode()
    assert "--point" not in fixed and "{call=--where}" in fixed


def test_filter_validation_and_errors():
    ok = _extcap("--extcap-interface", "fcap-dev-queue", "--extcap-capture-filter", "udp port 53")
    bad = _extcap("--extcap-interface", "fcap-dev-queue", "--extcap-capture-filter", "udp port")
    assert ok.returncode == 0 and bad.returncode == 1 and "syntax error" in bad.stdout.decode()
    r = _extcap("--extcap-interface", "nope", "--extcap-dlts")
    assert r.returncode == 1 and r.stderr.decode().startswith("fcap: no extcap interface 'nope' (fcap's: ")
    r = _extcap()
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1


# ---- installing ---------------------------------------------------------------------------------------------

def test_install_lists_interfaces_and_uninstall_removes(home, tshark, tmp_path):
    launcher = tmp_path / ".config/wireshark/extcap/fcap-extcap"
    assert os.access(launcher, os.X_OK)
    listed = _tshark(tshark, home, "-D").stdout
    for name, point in (("fcap-dev-queue", "dev:queue"), ("fcap-skb-drop", "skb:drop")):
        assert re.search(rf"^\d+\. {name} \(fcap: {point}, ", listed, re.M), listed
    assert re.search(r"^\d+\. fcap-any \(fcap: any point", listed, re.M)
    r = run_fcap(["extcap", "--uninstall"], env=home)
    assert r.returncode == 0 and not launcher.exists()
    assert "fcap-" not in _tshark(tshark, home, "-D").stdout
    launcher.write_text("#!/bin/sh\n")                       # someone else's file of that name stays
    r = run_fcap(["extcap", "--uninstall"], env=home)
    assert r.returncode == 1 and "is not fcap's launcher" in r.stderr.decode() and launcher.exists()


# ---- capturing through tshark -----------------------------------------------------------------------------------

def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tshark_captures_from_a_point(home, tshark, tmp_path):
    need_root()
    port, out = _port(), tmp_path / "x.pcapng"
    traffic = Stream(port, gap=0.2, payload=b"extcap")
    try:
        r = _tshark(tshark, home, "-i", "fcap-dev-queue", "-f", f"udp and dst port {port}", "-c", "3",
                    "-w", str(out))
    finally:
        traffic.stop()
    assert r.returncode == 0 and "3 packets captured" in r.stderr, r.stderr
    rows = _tshark(tshark, home, "-r", str(out), "-T", "fields", "-E", "separator=|", "-e", "udp.dstport",
                   "-e", "frame.interface_name", "-e", "frame.comment").stdout.splitlines()
    assert len(rows) == 3
    for row in rows:
        dport, iface, comment = row.split("|")
        assert dport == str(port) and iface == "dev:queue" and comment.startswith("skb=0x")
    _no_extcap_left(str(tmp_path))


def test_tshark_any_point_configured(home, tshark, tmp_path):
    need_root()
    port, out = _port(), tmp_path / "any.pcapng"
    traffic = Stream(port, gap=0.2, payload=b"extcap")
    try:
        r = _tshark(tshark, home, "-i", "fcap-any", "-o", "extcap.fcap_any.point:tp_btf/netif_receive_skb",
                    "-o", "extcap.fcap_any.dump:skb->dev->name", "-o", "extcap.fcap_any.where:skb->len > 10",
                    "-f", f"udp and dst port {port}", "-c", "2", "-w", str(out))
    finally:
        traffic.stop()
    assert r.returncode == 0 and "2 packets captured" in r.stderr, r.stderr
    rows = _tshark(tshark, home, "-r", str(out), "-T", "fields", "-E", "separator=|", "-e", "udp.dstport",
                   "-e", "frame.comment").stdout.splitlines()
    assert len(rows) == 2
    for row in rows:
        dport, comments = row.split("|")
        assert dport == str(port) and 'dump skb->dev->name @0x' in comments and '= (char[16])"lo"' in comments
    _no_extcap_left(str(tmp_path))


def test_tshark_asks_for_the_per_packet_features(home, tshark, tmp_path):
    """Wireshark's dialog offers each per-packet feature (fcap.features) as a checkbox: ticked (-o ...context:true,
    ...stack:true), each packet's comment carries its cgroup and its kernel stack, read back by fcap.read."""
    need_root()
    import fcap
    port, out = _port(), tmp_path / "features.pcapng"
    traffic = Stream(port, gap=0.2, payload=b"extcap")
    try:
        r = _tshark(tshark, home, "-i", "fcap-dev-queue", "-o", "extcap.fcap_dev_queue.context:true",
                    "-o", "extcap.fcap_dev_queue.stack:true", "-f", f"udp and dst port {port}", "-c", "2",
                    "-w", str(out))
    finally:
        traffic.stop()
    assert r.returncode == 0 and "2 packets captured" in r.stderr, r.stderr
    got = list(fcap.read(str(out)))
    assert len(got) == 2 and all(p.cgroup and p.cgroup_path and p.stack for p in got), [p.comment for p in got]
    assert all(any(f.startswith("__dev_queue_xmit+") for f in p.stack) for p in got), got[0].stack
    _no_extcap_left(str(tmp_path))


def _no_extcap_left(marker: str) -> None:
    """No fcap extcap process of this test is still running (tshark ends it when its capture ends)."""
    need_tool("ps")
    deadline = time.monotonic() + 10 * SLOW
    while time.monotonic() < deadline:
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        left = [line for line in ps.splitlines() if "fcap.commands.cli extcap --capture" in line and
                "wireshark_extcap_fcap" in line and _env_home(line) == marker]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"extcap processes left: {left}")


def _env_home(ps_line: str) -> str:
    pid = ps_line.split()[0]
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return ""
    return next((e[5:].decode() for e in env if e.startswith(b"HOME=")), "")
