"""Remote hosts through Wireshark's sshdump, end to end: an sshd started in a network namespace (the "remote
host", reached over a veth pair), tshark -i sshdump running fcap there (--remote-capture-command 'fcap ... -w -'),
the plain `ssh host fcap ... -w - | tshark -r -`, and two streams merged by mergecap with one IDB per stream."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading

import pytest
from conftest import need_root, need_tool

from netns import ROOT, SLOW, Stream, sh

SSHDUMP = "/usr/lib/x86_64-linux-gnu/wireshark/extcap/sshdump"


class Remote:
    """sshd in namespace `ns` at `addr`:`port`, root login with `key` only."""

    def __init__(self, v, tmp):
        self.v, self.tmp = v, tmp
        self.addr, self.port, self.key = v.peer, 2222, str(tmp / "client")
        self.proc = None

    def start(self) -> None:
        t = self.tmp
        for name in ("host", "client"):
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(t / name))
        shutil.copy(t / "client.pub", t / "authorized_keys")
        (t / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress {self.addr}\nHostKey {t / 'host'}\nAuthorizedKeysFile "
            f"{t / 'authorized_keys'}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile {t / 'sshd.pid'}\n")
        os.makedirs("/run/sshd", exist_ok=True)          # sshd's privilege separation directory
        self.proc = subprocess.Popen(self.v.exec(shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f",
                                                 str(t / "sshd_config")), stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        assert "Server listening" in line, line + (self.proc.stderr.read() if self.proc.poll() is not None else "")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def ssh_argv(self, command: str) -> list[str]:
        return ["ssh", "-i", self.key, "-p", str(self.port), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", f"root@{self.addr}", command]


def fcap_command(args: str) -> str:
    """fcap as the remote host runs it (this checkout's, with this Python)."""
    return f"PYTHONPATH={shlex.quote(str(ROOT))} {shlex.quote(sys.executable)} -m fcap {args}"


@pytest.fixture
def remote(veth_ns, tmp_path):
    need_tool("sshd", "the remote host's ssh server (apt install openssh-server)")
    need_tool("ssh")
    need_tool("ssh-keygen")
    r = Remote(veth_ns, tmp_path)
    try:
        r.start()
        yield r
    finally:
        r.stop()


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sshdump_args(r: Remote, command: str) -> list[str]:
    return ["-i", "sshdump", "-o", f"extcap.sshdump.remotehost:{r.addr}", "-o", f"extcap.sshdump.remoteport:{r.port}",
            "-o", "extcap.sshdump.remoteusername:root", "-o", f"extcap.sshdump.sshkey:{r.key}",
            "-o", f"extcap.sshdump.remotecapturecommand:{command}"]


def _fields(tshark: str, path, *fields: str) -> list[list[str]]:
    argv = [tshark, "-r", str(path), "-T", "fields", "-E", "separator=|"]
    for f in fields:
        argv += ["-e", f]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    return [line.split("|") for line in out.splitlines()]


def test_sshdump_runs_fcap_on_the_remote_host(remote, tshark, tmp_path):
    need_root()
    if not os.access(SSHDUMP, os.X_OK):
        pytest.skip(f"{SSHDUMP} is not installed (Wireshark's sshdump)")
    port, out = _port(), tmp_path / "remote.pcapng"
    command = fcap_command(f"-i tp_btf/net_dev_queue -w - -U -q 'udp and dst port {port}'")
    traffic = Stream(port, gap=0.2, payload=b"remote")
    try:
        r = subprocess.run([tshark, *_sshdump_args(remote, command), "-c", "3", "-w", str(out)],
                           capture_output=True, text=True, timeout=120 * SLOW)
    finally:
        traffic.stop()
    assert r.returncode == 0 and "3 packets captured" in r.stderr, r.stderr
    rows = _fields(tshark, out, "frame.interface_name", "udp.dstport", "frame.comment")
    assert len(rows) == 3 and all(row[:2] == ["tp_btf/net_dev_queue", str(port)] for row in rows), rows
    assert all(row[2].startswith("skb=0x") and " comm=" in row[2] for row in rows)
    _remote_fcap_ends(f"udp and dst port {port}")


def _remote_fcap_ends(tag: str) -> None:
    """The remote fcap ends when sshdump's channel closes, though no packet comes to fail a write on it."""
    import time
    deadline = time.monotonic() + 10 * SLOW
    while time.monotonic() < deadline:
        left = [p for p in os.listdir("/proc") if p.isdigit() and tag.encode() in _cmdline(p)]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"the remote fcap is still running: {left}")


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ")
    except OSError:
        return b""


def test_ssh_pipe_into_tshark(remote, tshark, tmp_path):
    need_root()
    port = _port()
    command = fcap_command(f"-i tp_btf/net_dev_queue -c 2 -w - -q 'udp and dst port {port}'")
    traffic = Stream(port, gap=0.2, payload=b"remote")
    try:
        ssh = subprocess.Popen(remote.ssh_argv(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        t = subprocess.run([tshark, "-r", "-", "-T", "fields", "-e", "udp.dstport", "-e", "frame.interface_name"],
                           stdin=ssh.stdout, capture_output=True, text=True, timeout=120 * SLOW)
        ssh.stdout.close()
        assert ssh.wait(timeout=60) == 0, ssh.stderr.read()
    finally:
        traffic.stop()
    assert t.stdout.splitlines() == [f"{port}\ttp_btf/net_dev_queue"] * 2, t.stdout + t.stderr


def test_two_streams_merged_one_idb_each(remote, tshark, tmp_path):
    """Two streams (here two points of one remote host; hosts alike) merged by mergecap -I none: one interface
    per stream and point, packets in time order."""
    need_root()
    need_tool("mergecap")
    port = _port()
    files = [tmp_path / "tx.pcapng", tmp_path / "rx.pcapng"]
    procs = []
    traffic = Stream(port, gap=0.2, payload=b"remote")
    try:
        for point, f in zip(("tp_btf/net_dev_queue", "tp_btf/netif_receive_skb"), files):
            cmd = fcap_command(f"-i {point} -c 3 -w - -q 'udp and dst port {port}'")
            procs.append(subprocess.Popen(remote.ssh_argv(cmd), stdout=open(f, "wb"), stderr=subprocess.PIPE))
        for p in procs:
            assert p.wait(timeout=120 * SLOW) == 0, p.stderr.read()
    finally:
        traffic.stop()
    merged = tmp_path / "all.pcapng"
    sh("mergecap", "-I", "none", "-w", str(merged), *map(str, files))
    rows = _fields(tshark, merged, "frame.interface_id", "frame.interface_name", "frame.time_epoch")
    assert len(rows) == 6
    assert {(r[0], r[1]) for r in rows} == {("0", "tp_btf/net_dev_queue"), ("1", "tp_btf/netif_receive_skb")}
    times = [float(r[2]) for r in rows]
    assert times == sorted(times)
