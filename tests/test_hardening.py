"""What users do to a capture: full disks, dead readers, many captures at once, many start/stop cycles. Each ends
with one line and a file readable up to its last whole record, and nothing of fcap's left in the kernel."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time

import pytest
from conftest import need_tool

from netns import bpf_ids_of, read_packets, run_fcap, send_udp, start_fcap

POINT = "tp_btf/net_dev_queue"


def _datagrams(n: int, size: int = 1000) -> list[bytes]:
    tag = os.urandom(8)
    return [tag + i.to_bytes(4, "big") + bytes(size - 12) for i in range(n)]


def _send_until_it_ends(fc, port: int, rounds: int, n: int, size: int) -> int:
    """Datagrams in rounds until fcap exits by itself (or the rounds run out); fcap's status."""
    try:
        for _ in range(rounds):
            send_udp("127.0.0.1", port, _datagrams(n, size))
            if fc.p.poll() is not None:
                break
            time.sleep(0.05)
        return fc.wait()
    finally:
        fc.kill()


def _one_error_line(err: str, start: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("fcap: ")]
    assert len(lines) == 1 and lines[0].startswith(start), err
    assert "Traceback" not in err, err
    return lines[0]


# ---- write errors ---------------------------------------------------------------------------------------------

def test_dev_full_is_one_line_and_status_1(sink):
    r = run_fcap(["-i", POINT, "-w", "/dev/full", f"udp port {sink.port}", "--",
                  "python3", "-c", f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                  f"[s.sendto(b'x' * 100, ('127.0.0.1', {sink.port})) for _ in range(50)]"])
    err = r.stderr.decode()
    assert r.returncode == 1, err
    _one_error_line(err, "fcap: /dev/full: No space left on device")
    assert "packets captured" in err and "dropped by kernel" in err, err


@pytest.fixture
def small_tmpfs():
    """A 256 KiB tmpfs, unmounted afterwards."""
    d = tempfile.mkdtemp(prefix="fcap-full-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", d], capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(d)
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=False)
        os.rmdir(d)


@pytest.mark.parametrize("name", ["full.pcap", "full.pcapng"])
def test_disk_filling_up_keeps_every_whole_record(sink, small_tmpfs, name):
    """The disk fills during the capture: one line, status 1, and the file holds whole records only (tcpdump
    reads it without complaint), as many as fitted."""
    tcpdump = need_tool("tcpdump", "reads the cut file back")
    path = os.path.join(small_tmpfs, name)
    fc = start_fcap(["-i", POINT, "-w", path, f"udp port {sink.port}"])
    rc = _send_until_it_ends(fc, sink.port, 40, 50, 1400)
    assert rc == 1, fc.stderr
    _one_error_line(fc.stderr, f"fcap: {path}: No space left on device")
    kept = read_packets(path)   # raises on a partial record
    assert len(kept) > 50, f"only {len(kept)} records before the disk was full"
    r = subprocess.run([tcpdump, "-nn", "-r", path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "truncated" not in r.stderr, r.stderr
    assert len(r.stdout.splitlines()) == len(kept)


def test_fifo_whose_reader_exits(sink, tmp_path):
    """-w FIFO and the reader goes away: one line naming the FIFO, status 1 (stdout pipes end quietly instead)."""
    fifo = str(tmp_path / "cap.fifo")
    os.mkfifo(fifo)
    reader = subprocess.Popen(["head", "-c", "3000", fifo], stdout=subprocess.DEVNULL)
    fc = start_fcap(["-i", POINT, "-U", "-w", fifo, f"udp port {sink.port}"])
    try:
        rc = _send_until_it_ends(fc, sink.port, 50, 5, 500)
    finally:
        reader.kill()
        reader.wait()
    assert rc == 1, fc.stderr
    _one_error_line(fc.stderr, f"fcap: {fifo}: Broken pipe")


# ---- many at once -----------------------------------------------------------------------------------------------

def test_eight_captures_of_one_point_each_get_every_packet(sink, tmp_path):
    pays = _datagrams(30, 200)
    procs, paths = [], []
    try:
        for i in range(8):
            paths.append(str(tmp_path / f"c{i}.pcapng"))
            procs.append(start_fcap(["-i", POINT, "-w", paths[-1], f"udp port {sink.port}"]))
        send_udp("127.0.0.1", sink.port, pays, pace=0.001)
        sink.wait(len(pays))
        rcs = [p.stop() for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert rcs == [0] * 8, [p.stderr for p in procs]
    for path in paths:
        got = sorted(p.l3[28:] for p in read_packets(path))
        assert got == sorted(pays), f"{path}: {len(got)} of {len(pays)}"


def test_fifty_start_stop_cycles_leave_nothing(root):
    """50 captures started and stopped (half by signal, half by -c with no traffic ending on a command): no
    program or link of theirs stays in the kernel."""
    need_tool("bpftool", "lists the kernel's BPF programs and links")
    seen: set[tuple[str, int]] = set()
    for i in range(50):
        if i % 2:
            fc = start_fcap(["-i", POINT, "-w", "/dev/null", "udp port 9"])
            ids = bpf_ids_of(fc.pid)
            rc = fc.stop()
        else:
            fc = start_fcap(["-i", POINT, "-w", "/dev/null", "udp port 9", "--", "true"])
            ids = bpf_ids_of(fc.pid) if fc.p.poll() is None else {"prog": set(), "link": set()}
            rc = fc.wait()
        fc.kill()
        assert rc == 0, fc.stderr
        seen |= {("prog", p) for p in ids["prog"]} | {("link", k) for k in ids["link"]}
    assert seen, "no program was ever seen"
    left = [f"{k} {i}" for k, i in seen
            if subprocess.run(["bpftool", k, "show", "id", str(i)], capture_output=True).returncode == 0]
    assert not left, f"left in the kernel: {left}"


def _past_interpreter_start(pid: int, timeout: float = 10.0) -> None:
    """Wait until fcap's own code runs: the interpreter installs its SIGINT handler (/proc shows SIGINT caught),
    then fcap gives SIGINT back to the default action first thing (not caught)."""
    deadline = time.monotonic() + timeout
    caught_once = False
    while time.monotonic() < deadline:
        try:
            caught = bool(int(_status_of(pid)["SigCgt"], 16) & 2)
        except (FileNotFoundError, ProcessLookupError):
            return
        if caught_once and not caught:
            return
        caught_once |= caught
        time.sleep(0.0005)


def test_signals_during_start_up_never_leave_a_traceback(root):
    """SIGINT at random moments while fcap starts: it ends with status 0 or by the signal (as tcpdump), and
    without a traceback. (From when fcap's code runs: before that the interpreter itself is starting, where any
    Python program can be interrupted with a traceback, or lose the signal.)"""
    import random
    import signal
    from netns import fcap_argv, subprocess_env
    rnd = random.Random(7)
    for _ in range(10):
        p = subprocess.Popen(fcap_argv() + ["-i", POINT, "-w", "/dev/null"], stderr=subprocess.PIPE,
                             env=subprocess_env())
        _past_interpreter_start(p.pid)
        timer = threading.Timer(rnd.uniform(0.0, 0.3), p.send_signal, (signal.SIGINT,))
        timer.start()
        try:
            _, err = p.communicate(timeout=30)
        finally:
            timer.cancel()
        assert p.returncode in (0, -signal.SIGINT), err.decode()
        assert b"Traceback" not in err, err.decode()


# ---- -Z USER -------------------------------------------------------------------------------------------------------

def _status_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_z_drops_to_the_user_and_the_file_is_theirs(sink, tmp_path):
    """-Z nobody: attached as root, then running as nobody (uid, gid, groups, no capabilities); the capture goes
    on, SIGINT prints the summary, the file belongs to nobody and holds every packet."""
    import pwd
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no user nobody")
    path = str(tmp_path / "z.pcapng")
    fc = start_fcap(["-Z", "nobody", "-i", POINT, "-w", path, f"udp port {sink.port}"])
    try:
        st = _status_of(fc.pid)
        deadline = time.monotonic() + 10
        while st["Uid"].split()[0] != str(nobody.pw_uid) and time.monotonic() < deadline:
            time.sleep(0.05)
            st = _status_of(fc.pid)
        pays = _datagrams(10, 300)
        send_udp("127.0.0.1", sink.port, pays, pace=0.001)
        sink.wait(len(pays))
        rc = fc.stop()
    finally:
        fc.kill()
    assert st["Uid"].split() == [str(nobody.pw_uid)] * 4 and st["Gid"].split() == [str(nobody.pw_gid)] * 4, st
    assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0, st
    assert rc == 0, fc.stderr
    assert "10 packets captured" in fc.stderr, fc.stderr
    assert os.stat(path).st_uid == nobody.pw_uid
    assert sorted(p.l3[28:] for p in read_packets(path)) == sorted(pays)


def test_z_with_no_such_user_is_one_line(root):
    r = run_fcap(["-Z", "no-such-user-fcap", "-i", POINT, "-w", "/dev/null"])
    assert r.returncode != 0
    _one_error_line(r.stderr.decode(), "fcap: -Z no-such-user-fcap: no such user")
