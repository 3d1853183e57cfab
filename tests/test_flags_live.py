"""tcpdump's flags in live captures on this kernel: -Q in|out per point, -l (lines on a pipe as they come),
--count, -e, -L (the link types a point gives, as tcpdump -L lists a device's)."""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import select
import subprocess
import time

import pytest
from conftest import need_tool

from netns import read_packets, run_fcap, send_udp, start_fcap

OUT, IN = "tp_btf/net_dev_queue", "tp_btf/netif_receive_skb"   # lo: every datagram passes both, out then in


def _lines(r: subprocess.CompletedProcess) -> list[str]:
    return r.stderr.decode().splitlines()


@pytest.mark.parametrize("direction,points", [("in", {IN}), ("out", {OUT}), ("inout", {IN, OUT}), ("IN", {IN})])
def test_Q_keeps_the_packets_going_that_way(sink, tmp_path, direction, points):
    """At a transmit point every packet goes out; at a receive point a packet goes in unless its pkt_type is
    PACKET_OUTGOING. With both points on lo, -Q in keeps the receive point's copies only, -Q out the transmit
    point's, -Q inout both (as without -Q)."""
    n = 6
    path = tmp_path / "q.pcapng"
    count = n * len(points)
    fc = start_fcap(["-i", OUT, "-i", IN, "-Q", direction, "-c", str(count), "-w", str(path),
                     f"udp port {sink.port}"])
    try:
        for _ in range(3):
            send_udp("127.0.0.1", sink.port, [b"q" * 40] * n)
            if fc.p.poll() is not None:
                break
            time.sleep(0.3)
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
    got = read_packets(path)
    assert len(got) == count and {p.iface_name for p in got} == points, [p.iface_name for p in got]


def test_Q_at_a_transmit_point_going_in_captures_nothing(sink, tmp_path):
    """-Q in at a transmit point: the program drops every packet (and the verifier takes it)."""
    fc = start_fcap(["-i", OUT, "-Q", "in", "-w", str(tmp_path / "none.pcapng"), f"udp port {sink.port}"])
    try:
        send_udp("127.0.0.1", sink.port, [b"x" * 10] * 5)
        time.sleep(0.3)
        assert fc.stop() == 0, fc.stderr
    finally:
        fc.kill()
    assert read_packets(tmp_path / "none.pcapng") == []
    assert "0 packets captured" in fc.stderr, fc.stderr


def test_Q_unknown_direction_is_one_line():
    r = run_fcap(["-i", OUT, "-Q", "sideways"])
    assert r.returncode == 2 and _lines(r) == ["fcap: unknown capture direction `sideways'"], r.stderr


def test_l_prints_each_packet_on_a_pipe_as_it_comes(sink):
    """-l: lines (not a capture file) on a pipe, each one there before the next packet or the end (| grep)."""
    fc = start_fcap(["-i", OUT, "-l", f"udp port {sink.port}"], stdout=subprocess.PIPE)
    try:
        for i in range(2):
            send_udp("127.0.0.1", sink.port, [b"l" * (10 + i)])
            ready, _, _ = select.select([fc.p.stdout], [], [], 10)
            assert ready, f"no line within 10 s; stderr:\n{fc.stderr}"
            line = fc.p.stdout.readline().decode()
            assert re.search(rf"IP 127\.0\.0\.1\.\d+ > 127\.0\.0\.1\.{sink.port}: UDP, length {10 + i}$", line), line
        assert fc.p.poll() is None   # still capturing: the lines came as the packets did
        assert fc.stop() == 0, fc.stderr
    finally:
        fc.kill()


def test_nn_prints_lines_on_a_pipe(sink):
    """-nn (what a tcpdump user types before | grep) asks for lines on a pipe, not a pcapng stream."""
    fc = start_fcap(["-i", OUT, "-nn", "-c", "2", f"udp port {sink.port}"], stdout=subprocess.PIPE)
    try:
        send_udp("127.0.0.1", sink.port, [b"n" * 10] * 2)
        assert fc.wait() == 0, fc.stderr
        out = fc.p.stdout.read().decode()
    finally:
        fc.kill()
    lines = out.splitlines()
    assert len(lines) == 2 and all(re.search(rf"> 127\.0\.0\.1\.{sink.port}: UDP, length 10$", ln) for ln in lines), out


def test_count_prints_no_packets_and_the_summary(sink):
    fc = start_fcap(["-i", OUT, "--count", "-c", "3", f"udp port {sink.port}"], stdout=subprocess.PIPE)
    try:
        send_udp("127.0.0.1", sink.port, [b"c" * 10] * 3)
        assert fc.wait() == 0, fc.stderr
        out = fc.p.stdout.read()
    finally:
        fc.kill()
    assert out == b"" and "3 packets captured" in fc.stderr, (out, fc.stderr)


def test_e_prints_the_link_level_header_on_a_pipe(sink):
    fc = start_fcap(["-i", OUT, "-e", "-c", "2", f"udp port {sink.port}"], stdout=subprocess.PIPE)
    try:
        send_udp("127.0.0.1", sink.port, [b"e" * 10] * 2)
        assert fc.wait() == 0, fc.stderr
        lines = fc.p.stdout.read().decode().splitlines()
    finally:
        fc.kill()
    assert len(lines) == 2, lines
    for line in lines:   # lo's Ethernet header: zero addresses
        assert re.search(r" 00:00:00:00:00:00 > 00:00:00:00:00:00, ethertype IPv4 \(0x0800\), length 52: "
                         rf"127\.0\.0\.1\.\d+ > 127\.0\.0\.1\.{sink.port}: UDP, length 10$", line), line


def _libpcap_description(number: int) -> str:
    from fcap.files.linktypes import dlt_for_libpcap
    lib = ctypes.CDLL(ctypes.util.find_library("pcap") or "libpcap.so.0.8")
    lib.pcap_datalink_val_to_description.restype = ctypes.c_char_p
    return lib.pcap_datalink_val_to_description(dlt_for_libpcap(number)).decode()


def test_L_lists_link_types_as_tcpdump(root):
    """-L: tcpdump's header line and one line per link type, named and described as libpcap does; the point's
    default first; IEEE802_11, which fcap does not print, marked as tcpdump marks what it cannot print."""
    tcpdump = need_tool("tcpdump", "its -L output is the format")
    theirs = subprocess.run([tcpdump, "-L", "-i", "lo"], capture_output=True, text=True, timeout=30)
    their_lines = (theirs.stdout + theirs.stderr).splitlines()
    assert "Data link types for lo (use option -y to set):" in their_lines and "  EN10MB (Ethernet)" in their_lines
    r = run_fcap(["-L", "-i", OUT, "-i", "tp_btf/kfree_skb"])
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[0] == f"Data link types for {OUT} (use option -y to set):"
    assert lines[1] == "  EN10MB (Ethernet)" and lines[7] == "Data link types for tp_btf/kfree_skb (use option -y " \
        "to set):" and lines[8] == "  LINUX_SLL2 (Linux cooked v2)"
    from fcap.files.linktypes import lookup
    for line in lines[1:7] + lines[8:]:
        m = re.fullmatch(r"  (\w+) \((.*?)\)( \(printing not supported\))?", line)
        assert m, line
        lt = lookup(m[1])
        assert m[2] == _libpcap_description(lt.number) and bool(m[3]) == (lt.name == "IEEE802_11"), line
    assert sorted(lines[1:7]) == sorted(lines[8:])


def test_L_errors_are_one_line(root):
    r = run_fcap(["-L"])
    assert r.returncode == 2 and _lines(r) == ["fcap: -L lists the link types of a capture point: give -i POINT"]
    r = run_fcap(["-L", "-i", "tp_btf/no_such_tracepoint"])
    assert r.returncode == 1 and len(_lines(r)) == 1 and "no tracepoint 'no_such_tracepoint'" in r.stderr.decode()
