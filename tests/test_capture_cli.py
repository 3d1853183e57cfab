"""fcap's command line end to end: the files and streams it writes (pcap, pcapng, -y raw, -s, -U, pipes) read back
in tcpdump and tshark, fcap -r; -c, -- COMMAND, signals, nothing left attached."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from decimal import Decimal

import pytest
from conftest import need_tool

from netns import (
    LINKTYPE_EN10MB,
    LINKTYPE_RAW,
    SLOW,
    Stream,
    UDPSink,
    bpf_ids_of,
    ipv6_loopback,
    l4_payload,
    read_packets,
    run_fcap,
    send_udp,
    start_fcap,
)
from packets import summary
from tsharkutil import no_error_text, tshark_rows
from test_capture import SETTLE, _sender, _sent, by_time


# ---- helpers -----------------------------------------------------------------------------------------------------

def _tagged(n: int, tag: bytes) -> list[bytes]:
    """n datagram payloads: the tag, a sequence number, and some filler (sizes vary)."""
    return [tag + struct.pack(">I", i) + bytes(range(256)) * (i % 5) for i in range(n)]


def assert_first_n(got: list[bytes], sent: list[bytes], n: int) -> None:
    """-c N: exactly N of the datagrams sent, distinct, in the order sent. (Ideally the first N; with per-CPU
    draining, a later datagram from another CPU's buffer can be written before an earlier one.)"""
    assert len(got) == n, f"{len(got)} packets, not {n}"
    idx = [sent.index(g) if g in sent else -1 for g in got]
    assert -1 not in idx, "a packet that was not sent"
    assert idx == sorted(set(idx)), f"not distinct datagrams in sending order: {idx}"


def _capture_udp(tmp_path, sink, args: list[str], out: str, n: int = 8, dst: str = "127.0.0.1"
                 ) -> tuple[str, list[bytes]]:
    """fcap ARGS -w OUT 'udp port N' while n tagged datagrams go to the sink; returns (path, payloads)."""
    path = str(tmp_path / out)
    tag = os.urandom(8)
    pays = _tagged(n, tag)
    fc = start_fcap(args + ["-w", path, f"udp port {sink.port}"])
    try:
        send_udp(dst, sink.port, pays)
        sink.wait(n)
        time.sleep(SETTLE)
        assert fc.stop() == 0, fc.stderr
    finally:
        fc.kill()
    return path, pays


# ---- 1. the files read back in tcpdump and tshark -------------------------------------------------------------

@pytest.mark.parametrize("out", ["x.pcap", "x.pcapng"])
def test_files_read_by_tcpdump_and_tshark(tcpdump, sink, tmp_path, out):
    path, pays = _capture_udp(tmp_path, sink, ["-i", "tp_btf/net_dev_queue"], out)
    with open(path, "rb") as f:
        magic = f.read(4)
    assert magic == ({"x.pcap": struct.pack("<I", 0xA1B23C4D), "x.pcapng": b"\x0a\x0d\x0d\x0a"}[out])
    r = subprocess.run(["tcpdump", "-nn", "-r", path], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not no_error_text(r.stderr), r.stderr
    lines = [ln for ln in r.stdout.splitlines() if f".{sink.port}: UDP" in ln]
    assert len(lines) == len(pays), r.stdout
    # (sorted: fcap writes each CPU's records in turn, see by_time)
    assert sorted(int(ln.rsplit("length ", 1)[1]) for ln in lines) == sorted(len(p) for p in pays)
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: the tcpdump half of this check passed")
    rows = sorted((Decimal(t), int(a), bytes.fromhex(b)) for t, a, b in
                  tshark_rows(path, "frame.time_epoch", "udp.dstport", "udp.payload"))
    assert [(a, b) for _, a, b in rows] == [(sink.port, p) for p in pays]


def test_two_points_two_interfaces(sink, tmp_path):
    """-i net_dev_queue -i netif_receive_skb: a pcapng with one interface per point, named after the point;
    on lo every datagram passes both (transmit, then receive), as the same skb."""
    qx, rx = "tp_btf/net_dev_queue", "tp_btf/netif_receive_skb"
    path, pays = _capture_udp(tmp_path, sink, ["-i", qx, "-i", rx], "two.pcapng", n=5)
    pkts = read_packets(path)
    assert {p.iface_name for p in pkts} == {qx, rx}
    assert all(p.linktype == LINKTYPE_EN10MB for p in pkts)
    for name in (qx, rx):
        assert sorted(l4_payload(p) for p in pkts if p.iface_name == name) == sorted(pays), name
    flags = {(p.iface_name, p.flags) for p in pkts}
    assert flags == {(qx, 2), (rx, 1)}, f"epb_flags direction: {flags}"
    # lo hands the transmitted skb itself to the receive path: one packet, one epb_packetid at both points
    ids = {(p.iface_name, l4_payload(p)): p.packet_id for p in pkts}
    assert all(ids[(qx, d)] == ids[(rx, d)] and ids[(qx, d)] for d in pays), ids
    if shutil.which("capinfos"):
        r = subprocess.run(["capinfos", path], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "Number of interfaces in file: 2" in r.stdout, r.stdout + r.stderr
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: the file was checked with fcap's reader, not Wireshark")
    rows = tshark_rows(path, "frame.interface_name", "udp.payload")
    assert {name for name, _ in rows} == {qx, rx}, rows
    for name in (qx, rx):
        assert sorted(bytes.fromhex(d) for n, d in rows if n == name) == sorted(pays), name


@pytest.mark.parametrize("way", ["file ring", "perf buffer"])
def test_no_comment(sink, tmp_path, way):
    """--no-comment: pcapng records without the metadata comment, whichever way they are made (the programs' file
    rings, or user space from the perf buffer); the same packets, interface, direction and distinct packet ids as
    with the comment, and each record smaller by its comment's option."""
    qx = "tp_btf/net_dev_queue"
    extra = ["--perf-buffer"] if way == "perf buffer" else []
    files = {}
    for name, flags in (("with", []), ("without", ["--no-comment"])):
        path, pays = _capture_udp(tmp_path, sink, ["-i", qx] + extra + flags, f"{name}.pcapng", n=6)
        pkts = by_time(read_packets(path))
        assert [l4_payload(p) for p in pkts] == pays, name
        assert {(p.iface_name, p.flags) for p in pkts} == {(qx, 2)}, name
        ids = [p.packet_id for p in pkts]
        assert all(ids) and len(set(ids)) == len(ids), f"{name}: packet ids {ids}"
        files[name] = path, pkts
    (with_path, with_pkts), (path, pkts) = files["with"], files["without"]
    assert all(p.comment and p.comment.startswith("skb=0x") for p in with_pkts)
    assert all(p.comment is None for p in pkts), [p.comment for p in pkts]
    # the same datagram sizes: the files differ by the comments' options alone (4 bytes + the text padded to 4)
    options = sum(4 + (len(p.comment.encode()) + 3) // 4 * 4 for p in with_pkts)
    assert os.path.getsize(with_path) - os.path.getsize(path) == options
    # fcap path follows the packet ids without the comments
    r = run_fcap(["path", path], text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(int(ln.split()[1].rstrip(":"), 16) for ln in r.stdout.splitlines() if ln.startswith("packet ")) \
        == sorted(p.packet_id for p in pkts), r.stdout
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: the file was checked with fcap's reader, not Wireshark")
    rows = tshark_rows(path, "frame.comment", "frame.packet_id", "udp.payload")
    assert [(c, int(i)) for c, i, _ in rows] == [("", p.packet_id) for p in read_packets(path)], rows


def test_no_comment_refused_where_the_comment_is_the_output(root, tmp_path):
    """--no-comment with a pcap file, or with a flag that writes into the comment: one line, exit 1."""
    for args, says in ((["-w", str(tmp_path / "x.pcap")], "only pcapng records carry a comment (-w FILE.pcapng)"),
                       (["--stack", "-w", str(tmp_path / "x.pcapng")], "--stack writes into the comment"),
                       (["--dump", "skb->len", "-w", str(tmp_path / "x.pcapng")], "--dump writes into the comment")):
        r = run_fcap(["-i", "tp_btf/net_dev_queue", "--no-comment"] + args, text=True)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"fcap: --no-comment: {says}"], r.stderr
        assert not os.path.exists(args[-1])


# ---- 2. -y raw -------------------------------------------------------------------------------------------------

def test_linktype_raw(sink, tmp_path):
    path, pays = _capture_udp(tmp_path, sink, ["-i", "tp_btf/net_dev_queue", "-y", "raw"], "raw.pcap")
    with open(path, "rb") as f:
        head = f.read(24)
    magic, _vmaj, _vmin, _zone, _sig, snaplen, linktype = struct.unpack("<IHHiIII", head)
    assert (magic, linktype) == (0xA1B23C4D, LINKTYPE_RAW), head.hex()
    pkts = by_time(read_packets(path))
    assert [p.raw[0] for p in pkts] == [0x45] * len(pays)
    assert [l4_payload(p) for p in pkts] == pays
    assert all(p.orig_l3_len == len(p.raw) == 28 + len(d) for p, d in zip(pkts, pays))
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: linktype and bytes checked; Wireshark's decode not")
    # (udp:data, or whatever Wireshark guesses the random port carries)
    rows = tshark_rows(path, "frame.protocols", "ip.dst", "udp.dstport")
    assert [(proto.startswith("raw:ip:udp"), dst, port) for proto, dst, port in rows] == \
        [(True, "127.0.0.1", str(sink.port))] * len(pays), rows


def test_linktype_raw_ipv6(root, tmp_path):
    if not ipv6_loopback():
        pytest.skip("no IPv6 on lo (::1 cannot be bound)")
    with UDPSink("::1") as s6:
        path, pays = _capture_udp(tmp_path, s6, ["-i", "tp_btf/net_dev_queue", "-y", "raw"], "raw6.pcap", n=4,
                                      dst="::1")
    pkts = by_time(read_packets(path))
    assert [p.raw[0] >> 4 for p in pkts] == [6] * len(pays)
    assert [l4_payload(p) for p in pkts] == pays


# ---- 3. pipes ---------------------------------------------------------------------------------------------------

def _pipe_into(reader_argv: list[str], fcap_args: list[str], port: int, n: int, sink) -> tuple:
    """fcap ... | READER: fcap's stdout is the reader's stdin. Sends n tagged datagrams once fcap listens;
    returns (fcap exit status, fcap stderr, reader's CompletedProcess-like (rc, out, err), payloads)."""
    r, w = os.pipe()
    try:
        reader = subprocess.Popen(reader_argv, stdin=r, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        os.close(r)
    fc = None
    try:
        try:
            fc = start_fcap(fcap_args + [f"udp port {port}"], stdout=w)
        finally:
            os.close(w)     # fcap holds the only write end: the reader sees EOF when fcap exits
        pays = _tagged(n, os.urandom(8))
        send_udp("127.0.0.1", port, pays)
        rc = fc.wait() if "-c" in fcap_args else fc.stop()
        out, err = reader.communicate(timeout=60)
        return rc, fc.stderr, (reader.returncode, out.decode(), err.decode()), pays
    finally:
        if fc is not None:
            fc.kill()
        if reader.poll() is None:
            reader.kill()
            reader.wait()


def test_pipe_to_tshark(tshark, sink):
    """stdout not a terminal and no -w: a pcapng stream; -c 5 ends it."""
    rc, err, (trc, out, terr), pays = _pipe_into(["tshark", "-r", "-", "-T", "fields", "-e", "frame.time_epoch",
                                                  "-e", "udp.payload"],
                                                 ["-i", "tp_btf/net_dev_queue", "-c", "5"], sink.port, 8, sink)
    assert rc == 0, err
    assert "5 packets captured" in err
    assert trc == 0 and not no_error_text(terr), terr
    rows = sorted((Decimal(t), bytes.fromhex(d)) for t, d in (ln.split("\t") for ln in out.splitlines()))
    assert_first_n([d for _, d in rows], pays, 5)


def test_pipe_to_tcpdump(tcpdump, sink):
    """-w - : the stream on stdout, read by tcpdump -r - as it comes (stopped by SIGINT)."""
    rc, err, (trc, out, terr), pays = _pipe_into(["tcpdump", "-nn", "-r", "-"],
                                                 ["-i", "tp_btf/net_dev_queue", "-w", "-"], sink.port, 6, sink)
    assert rc == 0, err
    assert trc == 0 and not no_error_text(terr), terr
    lines = [ln for ln in out.splitlines() if f".{sink.port}: UDP" in ln]
    assert sorted(int(ln.rsplit("length ", 1)[1]) for ln in lines) == sorted(len(p) for p in pays), out


def test_closed_pipe_is_quiet(sink):
    """fcap | head -c 100 with traffic flowing: when head exits, fcap ends quietly with status 0."""
    r, w = os.pipe()
    try:
        head = subprocess.Popen(["head", "-c", "100"], stdin=r, stdout=subprocess.PIPE)
    finally:
        os.close(r)
    fc = stream = None
    try:
        try:
            fc = start_fcap(["-i", "tp_btf/net_dev_queue"], stdout=w)
        finally:
            os.close(w)
        stream = Stream(sink.port)
        got = head.stdout.read()
        head.wait(timeout=30)
        assert len(got) == 100 and got[:4] == b"\x0a\x0d\x0d\x0a", got
        rc = fc.wait()
    finally:
        if stream is not None:
            stream.close()
        if fc is not None:
            fc.kill()
        if head.poll() is None:
            head.kill()
            head.wait()
    assert rc == 0, fc.stderr
    assert "Traceback" not in fc.stderr and "Error" not in fc.stderr and "Exception" not in fc.stderr, fc.stderr


# ---- 4. -c, -- COMMAND, signals, nothing left attached -------------------------------------------------------

def test_count_stops_after_exactly_n(sink, tmp_path):
    path = str(tmp_path / "c3.pcapng")
    tag = os.urandom(8)
    pays = _tagged(10, tag)
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "-c", "3", "-w", path, f"udp port {sink.port}"])
    try:
        send_udp("127.0.0.1", sink.port, pays, pace=0.001)
        rc = fc.wait()          # no signal: -c ends it
    finally:
        fc.kill()
    assert rc == 0, fc.stderr
    s = summary(fc.stderr)
    assert s["captured"] == 3, fc.stderr
    assert_first_n([l4_payload(p) for p in by_time(read_packets(path))], pays, 3)


def test_command_runs_and_its_status_is_fcaps(sink, tmp_path):
    """fcap ... -- CMD: attach, run CMD, stop when it exits; the capture holds what CMD sent."""
    path = str(tmp_path / "cmd.pcapng")
    tag = os.urandom(8)
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "-w", path, f"udp port {sink.port}", "--",
                  *_sender(sink.port, tag, 4)])
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "Traceback" not in err
    assert summary(err)["captured"] == 4, err
    assert [l4_payload(p) for p in by_time(read_packets(path))] == _sent(tag, 4)


def test_command_with_ping(root, tmp_path):
    if shutil.which("ping") is None:
        pytest.skip("ping is not installed (test_command_runs_and_its_status_is_fcaps covers -- CMD)")
    path = str(tmp_path / "ping.pcapng")
    tag = os.urandom(8)
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "-w", path, "icmp", "--",
                  "ping", "-n", "-c", "2", "-i", "0.2", "-p", tag.hex(), "127.0.0.1"])
    assert r.returncode == 0, r.stderr.decode()
    echoes = [p for p in read_packets(path) if tag in p.l3]
    assert sorted(p.l3[20] for p in echoes) == [0, 0, 8, 8], "not 2 echo requests (8) and 2 replies (0)"


@pytest.mark.parametrize("code,expect", [(3, 3), (0, 0), ("TERM", 128 + signal.SIGTERM)])
def test_command_exit_status(root, code, expect):
    """fcap exits with the command's status (128 + N when a signal N killed it, as a shell says)."""
    cmd = ["sh", "-c", "kill -TERM $$"] if code == "TERM" else [sys.executable, "-c", f"import sys; sys.exit({code})"]
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "-w", "/dev/null", "--", *cmd])
    err = r.stderr.decode()
    assert r.returncode == expect, err
    assert "Traceback" not in err
    summary(err)


def test_count_ends_a_longer_command_with_status_0(sink, tmp_path):
    """-c ends the capture before the command: the command is terminated, fcap's status is 0 (not the command's)."""
    path = str(tmp_path / "c2.pcap")
    marker = tmp_path / "still-running"
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "-c", "2", "-w", path, f"udp port {sink.port}", "--",
                     "sh", "-c", f"sleep 30; touch {marker}"])
    try:
        send_udp("127.0.0.1", sink.port, _tagged(4, os.urandom(8)), pace=0.001)
        rc = fc.wait()
    finally:
        fc.kill()
    assert rc == 0, fc.stderr
    assert summary(fc.stderr)["captured"] == 2, fc.stderr
    time.sleep(0.2)
    assert not marker.exists()
    assert len(read_packets(path)) == 2


def test_command_stdout_stays_out_of_the_stream(root, tmp_path):
    """Packets on stdout: the command's own output goes to stderr, and the stream stays a valid pcapng."""
    tag = os.urandom(8).hex()
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "-w", "-", "--", sys.executable, "-c", f"print('{tag}')"])
    assert r.returncode == 0, r.stderr.decode()
    assert tag.encode() not in r.stdout and tag in r.stderr.decode()
    path = tmp_path / "stream.pcapng"
    path.write_bytes(r.stdout)
    read_packets(str(path))   # raises on anything but a whole pcapng file


def test_command_not_found(root):
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "-w", "/dev/null", "--", "/nonexistent/command"])
    err = r.stderr.decode()
    assert r.returncode != 0
    assert "Traceback" not in err
    assert any(ln.startswith("fcap: /nonexistent/command") for ln in err.splitlines()), err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_ends_cleanly(tcpdump, sink, tmp_path, sig):
    """SIGINT/SIGTERM: the file is complete (every packet sent, readable), the summary is printed, status 0."""
    path = str(tmp_path / "sig.pcap")
    tag = os.urandom(8)
    pays = _tagged(20, tag)
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "-w", path, f"udp port {sink.port}"])
    try:
        send_udp("127.0.0.1", sink.port, pays)
        sink.wait(len(pays))
        rc = fc.stop(sig)
    finally:
        fc.kill()
    assert rc == 0, fc.stderr
    s = summary(fc.stderr)
    assert s == {"captured": 20, "received by filter": 20, "dropped by kernel": 0}, fc.stderr
    assert [l4_payload(p) for p in by_time(read_packets(path))] == pays
    r = subprocess.run(["tcpdump", "-nn", "-r", path], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not no_error_text(r.stderr), r.stderr
    assert len(r.stdout.splitlines()) == 20


def _bpf_object_exists(kind: str, ident: int) -> bool:
    r = subprocess.run(["bpftool", kind, "show", "id", str(ident)], capture_output=True, text=True, timeout=30)
    return r.returncode == 0


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "count", "command", "closed pipe"])
def test_nothing_left_attached(sink, how):
    """However fcap ends, the programs and links it made are gone afterwards (bpftool cannot find them)."""
    need_tool("bpftool", "lists the kernel's BPF programs and links")
    args = ["-i", "tp_btf/net_dev_queue", "-i", "raw_tp/netif_receive_skb", f"udp port {sink.port}"]
    out = subprocess.DEVNULL
    reader = None
    if how == "count":
        args = ["-c", "2"] + args
    elif how == "command":
        args = args + ["--", "cat"]      # runs until its stdin (ours) ends
    if how == "closed pipe":
        r, w = os.pipe()
        # (more than the stream's header blocks: the reader leaves once packets flow, after fcap's ids were read)
        reader = subprocess.Popen(["head", "-c", "4096"], stdin=r, stdout=subprocess.DEVNULL)
        os.close(r)
        out = w
    else:
        args = ["-w", "/dev/null"] + args
    stream = None
    fc = start_fcap(args, stdout=out, stdin=subprocess.PIPE)
    try:
        if reader is not None:
            os.close(out)
        ids = bpf_ids_of(fc.pid)
        assert len(ids["prog"]) >= 2 and len(ids["link"]) >= 2, f"fcap holds no programs/links? {ids}"
        for pid in ids["prog"]:
            assert _bpf_object_exists("prog", pid), f"bpftool does not see program {pid} while fcap runs"
        if how in ("count", "closed pipe"):
            stream = Stream(sink.port)
            rc = fc.wait()
        elif how == "command":
            fc.p.stdin.close()
            rc = fc.wait()
        else:
            rc = fc.stop(getattr(signal, how))
    finally:
        if stream is not None:
            stream.close()
        fc.kill()
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
    assert rc == 0, fc.stderr
    left = [f"prog {i}" for i in ids["prog"] if _bpf_object_exists("prog", i)]
    left += [f"link {i}" for i in ids["link"] if _bpf_object_exists("link", i)]
    assert not left, f"still in the kernel after fcap exited ({how}): {left}"


# ---- 5. fcap -r ---------------------------------------------------------------------------------------------------

def test_read_prints_like_tcpdump(tcpdump, sink, tmp_path):
    """fcap -r FILE prints one line per packet; after the timestamp, the same text as tcpdump -nn -r FILE for
    simple UDP and ICMP."""
    path = str(tmp_path / "r.pcap")
    tag = os.urandom(8)
    expr = f"udp port {sink.port}"
    cmd = _sender(sink.port, tag, 3)
    if shutil.which("ping"):
        expr = f"({expr}) or icmp"
        cmd = ["sh", "-c", f'"$@" && ping -n -c 2 -i 0.2 -p {tag.hex()} 127.0.0.1 >/dev/null', "sh", *cmd]
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "-w", path, expr, "--", *cmd])
    assert r.returncode == 0, r.stderr.decode()
    mine = [i for i, p in enumerate(read_packets(path)) if tag in p.l3]
    ours = run_fcap(["-r", path])
    theirs = subprocess.run(["tcpdump", "-nn", "-r", path], capture_output=True, timeout=30)
    assert ours.returncode == 0, ours.stderr.decode()
    assert b"Traceback" not in ours.stderr
    o, t = ours.stdout.decode().splitlines(), theirs.stdout.decode().splitlines()
    assert len(o) == len(t)

    def rest(line: str) -> str:
        return line.split(" ", 1)[1]

    for i in mine:
        assert rest(o[i]) == rest(t[i]), f"packet {i}:\n fcap:    {o[i]}\n tcpdump: {t[i]}"
    # same clock: the timestamps agree to the microsecond
    assert [ln.split(" ", 1)[0] for ln in o] == [ln.split(" ", 1)[0] for ln in t]


# ---- 6. snaplen, -U -------------------------------------------------------------------------------------------------

def test_snaplen(sink, tmp_path):
    """-s 100: every packet cut to 100 bytes (from the Ethernet header), original lengths intact."""
    path, pays = _capture_udp(tmp_path, sink, ["-i", "tp_btf/net_dev_queue", "-s", "100"], "s100.pcap")
    pkts = by_time(read_packets(path))
    assert len(pkts) == len(pays)
    for p, d in zip(pkts, pays):
        whole = 14 + 28 + len(d)
        assert p.orig_l3_len + 14 == whole
        assert len(p.raw) == min(100, whole), f"{len(p.raw)} bytes kept of {whole}"
        assert l4_payload(p) == d[:len(p.raw) - 42]
    with open(path, "rb") as f:
        assert struct.unpack("<IHHiIII", f.read(24))[5] == 100, "snaplen in the file header"


def test_immediate_mode(sink, tmp_path):
    """-U: each packet is in the file while fcap is still running."""
    path = tmp_path / "u.pcap"
    tag = os.urandom(8)
    pays = _tagged(3, tag)
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "-U", "-w", str(path), f"udp port {sink.port}"])
    try:
        send_udp("127.0.0.1", sink.port, pays)
        deadline = time.monotonic() + 10 * SLOW
        got: list = []
        while time.monotonic() < deadline:
            try:
                got = read_packets(path)
            except Exception:  # noqa: BLE001 - a record half written: read again
                got = []
            if len(got) >= len(pays):
                break
            time.sleep(0.05)
        assert fc.p.poll() is None, "fcap exited"
        assert sorted(l4_payload(p) for p in got) == sorted(pays), f"{len(got)} of {len(pays)} in the file " \
                                                                   f"while fcap runs"
        assert fc.stop() == 0, fc.stderr
    finally:
        fc.kill()
