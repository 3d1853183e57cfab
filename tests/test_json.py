"""fcap --json: one JSON object per packet and line, live and with -r. The lines are checked against what the same
packets say elsewhere: a pcapng fcap wrote at the same time (read back with -r --json, and by tshark's fields), a
drop point's reason, tcpdump's own test corpus; and the stream ends cleanly under | head -1."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from netns import Stream, run_fcap, send_udp, start_fcap, tcp_bulk
from test_capture import SETTLE
from tsharkutil import tshark_rows

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "tcpdump-tests"
# what depends on the capturing session, not on the packet: left out when two sessions' lines are compared
SESSION_KEYS = ("ts_ns", "packet_id")


def _lines(text: str) -> list[dict]:
    """Every line of --json's output parsed (a line that is not one JSON object fails the test); no null values."""
    out = [json.loads(ln) for ln in text.splitlines()]
    assert all(isinstance(o, dict) for o in out)
    assert all(None not in list(_values(o)) for o in out), "a null value"
    return out


def _values(o):
    if isinstance(o, dict):
        for v in o.values():
            yield from _values(v)
    elif isinstance(o, list):
        for v in o:
            yield from _values(v)
    else:
        yield o


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _same_time(tmp_path, sink, args: list[str], traffic) -> tuple[list[dict], Path]:
    """fcap --json ARGS and fcap ARGS -w FILE.pcapng running together over the same traffic: (the JSON lines,
    the file)."""
    path = tmp_path / "same.pcapng"
    out = tmp_path / "live.json"
    with open(out, "wb") as f:
        js = start_fcap(["--json"] + args, stdout=f)
        try:
            wr = start_fcap(args[:-1] + ["-w", str(path), args[-1]])
            try:
                traffic()
                time.sleep(SETTLE)
                assert wr.stop() == 0, wr.stderr
            finally:
                wr.kill()
            assert js.stop() == 0, js.stderr
        finally:
            js.kill()
        assert "Traceback" not in js.stderr and "packets captured" in js.stderr, js.stderr
    return _lines(out.read_text()), path


def test_live_json_equals_the_file_written_at_the_same_time_and_tshark(root, tshark, sink, tmp_path):
    """UDP datagrams and a TCP connection on lo: the live lines are the packets, in order, of a pcapng written at
    the same time, as -r --json reads it back (but the time and packet id, each session's own); and their
    addresses, ports, protocols and TCP flags are tshark's."""
    holder = {}

    def traffic():
        send_udp("127.0.0.1", sink.port, [b"j" * n for n in (10, 300, 1400)])
        holder["tcp"] = tcp_bulk("127.0.0.1", 20000)
    # (the TCP server's port is not known before: capture the loopback's TCP and UDP, pick ours after)
    live, path = _same_time(tmp_path, sink, ["-i", "dev:queue", "-i", "dev:receive", "udp or tcp"], traffic)
    server, client = holder["tcp"]
    ours = {sink.port, server, client}

    def mine(objs):
        return [o for o in objs if (o.get("udp") or o.get("tcp") or {}).get("dport") in ours]
    r = run_fcap(["-r", str(path), "--json"])
    assert r.returncode == 0 and not r.stderr, r.stderr
    back = _lines(r.stdout.decode())
    live, back_mine = mine(live), mine(back)
    assert len(live) > 6 and {o["point"] for o in live} == {"dev:queue", "dev:receive"}
    strip = [{k: v for k, v in o.items() if k not in SESSION_KEYS} for o in live]
    assert strip == [{k: v for k, v in o.items() if k not in SESSION_KEYS} for o in back_mine]
    for o in live:
        assert o["comm"] and o["ifindex"] == 1 and o["skb"].startswith("0x") and o["caplen"] == o["len"]
        assert o["direction"] == ("out" if o["point"] == "dev:queue" else "in")
    assert any(o["tcp"]["flags"] == ["SYN"] for o in live if "tcp" in o)
    assert any(o["tcp"]["flags"] == ["SYN", "ACK"] for o in live if "tcp" in o)
    # tshark's fields of every packet of the file, against the file's JSON lines, packet by packet
    rows = tshark_rows(path, "ip.src", "ip.dst", "ip.proto", "udp.srcport", "udp.dstport", "tcp.srcport",
                       "tcp.dstport", "tcp.flags", "frame.len", "frame.cap_len")
    assert len(rows) == len(back)
    for o, row in zip(back, rows):
        t = o.get("tcp") or o.get("udp") or {}
        want = [o["ip"]["src"], o["ip"]["dst"], str(o["ip"]["proto"])]
        want += [str(t["sport"]), str(t["dport"]), "", "", ""] if "udp" in o else \
            ["", "", str(t["sport"]), str(t["dport"]), f"0x{_flag_bits(t['flags']):04x}"]
        assert row == want + [str(o["len"]), str(o["caplen"])], (o, row)


def test_live_lines_without_a_packet_are_the_packets_lines(root, sink):
    """Live --json writes the common records' lines without a fcap.Packet (fcap.live.jsonlines): on the kernel's
    own records (UDP of three sizes, a TCP connection, pings; out at dev:queue with its queue, in at dev:receive),
    each such line is the text, byte for byte, that the Packet's encoder writes; a record of another link type has
    no such line."""
    import io
    from netns import ping
    from fcap.live.output import JsonSink
    from fcap.live.session import Config, Session
    from fcap.text.jsonout import packet_line
    lines = {}
    for linktype in ("EN10MB", "LINUX_SLL2"):
        s = Session(Config(points=["dev:queue", "dev:receive"], linktype=linktype, filter="udp or tcp or icmp"))
        s.resolve()
        s.open()
        try:
            s.attach()
            send_udp("127.0.0.1", sink.port, [b"q" * n for n in (0, 300, 1400)])
            tcp_bulk("127.0.0.1", 3000)
            ping("127.0.0.1", count=2, interval=0.05)
            time.sleep(SETTLE)
            recs: list = []
            s.run(lambda r: recs.append(r) or True, stop=lambda: True)
            js = JsonSink(io.StringIO())
            js.open(s)
            lines[linktype] = [(js.fast(r) if js.fast else None, packet_line(js.packet(r))) for r in recs]
        finally:
            s.close()
    fast = lines["EN10MB"]
    assert len(fast) > 12 and all(a == b for a, b in fast), [(a, b) for a, b in fast if a != b][:2]
    objs = [json.loads(b) for _a, b in fast]
    assert {o["point"] for o in objs} == {"dev:queue", "dev:receive"} and any("queue" in o for o in objs)
    assert {p for o in objs for p in ("udp", "tcp", "icmp") if p in o} == {"udp", "tcp", "icmp"}
    assert all(a is None for a, _b in lines["LINUX_SLL2"]) and lines["LINUX_SLL2"]


def test_live_batches_are_the_packets_lines(root, sink):
    """Live --json a batch at a time (fcap.live.jsonlines.JsonWriter, over the records the perf buffer's drain hands
    over with their metadata): on the kernel's own records (UDP of three sizes over IPv4 and IPv6, a TCP connection,
    pings; out at dev:queue with its queue, in at dev:receive; a sender whose name holds a '%' and a letter that is
    not ASCII), the batch's text is, line for line, what the Packet's encoder writes of each record."""
    import ctypes
    import io
    from netns import ping
    from fcap.kernel.layout import META, META_SIZE, parse_record
    from fcap.live.drain import FAST, WITH_META
    if FAST.wait() is None:
        pytest.skip(f"numpy: {FAST.missing}")
    from fcap.live.jsonlines import JsonWriter, record_lines
    from fcap.live.output import JsonSink
    from fcap.live.session import Config, Session
    from fcap.text.jsonout import packet_line

    class Records:   # (the drain's writer: the records with their META, kept)
        fmt = WITH_META

        def __init__(self):
            self.data = bytearray()

        def writev(self, parts):
            for p in parts:
                self.data += bytes(p)

        def write_records(self, data, starts):
            self.data += bytes(data)
    s = Session(Config(points=["dev:queue", "dev:receive"], filter="udp or tcp or icmp or icmp6"))
    s.resolve()
    s.open()
    libc = ctypes.CDLL(None, use_errno=True)
    name = ctypes.create_string_buffer(16)
    libc.prctl(16, name, 0, 0, 0)   # (PR_GET_NAME, then PR_SET_NAME: this thread's name, as the points see it)
    try:
        s.attach()
        libc.prctl(15, "fc%sj\u00e9".encode(), 0, 0, 0)
        send_udp("127.0.0.1", sink.port, [b"q" * n for n in (0, 300, 1400)])
        send_udp("::1", sink.port, [b"6" * 40])
        libc.prctl(15, name.value, 0, 0, 0)
        tcp_bulk("127.0.0.1", 3000)
        ping("127.0.0.1", count=2, interval=0.05)
        time.sleep(SETTLE)
        got = Records()
        s.run_file(s.file_drain(got), stop=lambda: True)
    finally:
        libc.prctl(15, name.value, 0, 0, 0)
        s.close()
    js = JsonSink(io.StringIO())
    js.open(s)
    assert record_lines(js) is not None
    data, at, offsets, want = bytes(got.data), 0, [], []
    while at < len(data):
        offsets.append(at)
        end = at + META_SIZE + META.unpack(data, at).caplen
        want.append(packet_line(js.packet(parse_record(data[at:end]))))
        at = end
    text = "".join(p.decode() if isinstance(p, bytes) else p for p in JsonWriter(js).text(data, offsets))
    assert text.splitlines(True) == want
    objs = [json.loads(ln) for ln in want]
    assert len(objs) > 12 and {o["point"] for o in objs} == {"dev:queue", "dev:receive"}
    assert any("queue" in o for o in objs) and "fc%sj\u00e9" in {o["comm"] for o in objs}
    assert {p for o in objs for p in ("udp", "tcp", "icmp") if p in o} == {"udp", "tcp", "icmp"}
    assert {o["ip"]["version"] for o in objs} == {4, 6}


def _flag_bits(names: list[str]) -> int:
    from fcap.text.dissect.transport import TCP_FLAG_NAMES
    return sum(1 << TCP_FLAG_NAMES.index(n) for n in names)


def test_drop_point_gives_reason_and_location(root):
    """A datagram to a closed port at skb:drop: the line says the point, why (NO_SOCKET) and where."""
    port = _closed_port()
    fc = start_fcap(["--json", "-i", "skb:drop", "-c", "1", f"udp and dst port {port}"], stdout=subprocess.PIPE)
    try:
        send_udp("127.0.0.1", port, [b"d" * 11])
        assert fc.wait() == 0, fc.stderr
        (o,) = _lines(fc.p.stdout.read().decode())
    finally:
        fc.kill()
    assert o["point"] == "skb:drop" and "+0x" in o["location"]
    assert o.get("reason", "NO_SOCKET") == "NO_SOCKET"   # (no reason before Linux 5.17)
    assert o["udp"] == {"sport": o["udp"]["sport"], "dport": port} and o["ip"]["dst"] == "127.0.0.1"


def test_count_and_line_buffered(root, sink):
    """-c N: N lines, then exit 0; -l: each line is there as soon as it is written (the reader sees the first
    before the capture ends)."""
    fc = start_fcap(["--json", "-l", "-i", "dev:queue", "-c", "3", f"udp port {sink.port}"],
                    stdout=subprocess.PIPE)
    stream = Stream(sink.port, gap=0.3)
    try:
        first = fc.p.stdout.readline()
        assert fc.p.poll() is None and json.loads(first)["udp"]["dport"] == sink.port
        assert fc.wait() == 0, fc.stderr
        rest = fc.p.stdout.read().decode()
    finally:
        stream.close()
        fc.kill()
    assert len(_lines(first.decode() + rest)) == 3


def test_closed_pipe_ends_cleanly(root, sink):
    """fcap --json | head -1 with traffic flowing: one line, then fcap ends with 0, no traceback, no error line."""
    r, w = os.pipe()
    head = subprocess.Popen(["head", "-1"], stdin=r, stdout=subprocess.PIPE)
    os.close(r)
    stream = fc = None
    try:
        try:
            fc = start_fcap(["--json", "-i", "dev:queue", f"udp port {sink.port}"], stdout=w)
        finally:
            os.close(w)
        stream = Stream(sink.port)
        got = head.stdout.read()
        head.wait(timeout=30)
        rc = fc.wait()
    finally:
        if stream is not None:
            stream.close()
        if fc is not None:
            fc.kill()
    assert rc == 0 and len(_lines(got.decode())) == 1
    assert "Traceback" not in fc.stderr and "rror" not in fc.stderr, fc.stderr


@pytest.mark.parametrize("flags", [["-w", "x.pcapng"], ["-x"], ["-A"], ["-e"], ["-v"], ["--count"], ["--path"]])
def test_usage_errors(flags):
    """--json with a file or another way of printing: one line, exit 2 (nothing attached)."""
    r = run_fcap(["--json", "-i", "dev:queue"] + flags)
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and "--json" in r.stderr.decode(), r.stderr
    assert not os.path.exists("x.pcapng")


# ---- -r on files others wrote ------------------------------------------------------------------------------------

def _corpus(name: str) -> Path:
    p = CORPUS / name
    if not p.exists():
        pytest.skip(f"{p} is not there")
    return p


@pytest.mark.parametrize("name", ["icmp6-rfc8335.pcap", "OSPFv2_Capture_FINAL.pcapng",
                                  "802.1ad_QinQ.pcap", "LINKTYPE_RAW_ipv6.pcap", "bigtcp-ipv6-hbh.pcap"])
def test_read_corpus_file(tshark, name):
    """-r FILE --json on tcpdump's test captures: a line per packet (tshark's count) with their addresses."""
    path = _corpus(name)
    r = run_fcap(["-r", str(path), "--json"])
    assert r.returncode == 0 and not r.stderr, r.stderr
    objs = _lines(r.stdout.decode())
    rows = tshark_rows(path, "ip.src", "ipv6.src", "ip.dst", "ipv6.dst", "frame.len", "frame.cap_len")
    assert len(objs) == len(rows)
    for o, (s4, s6, d4, d6, flen, caplen) in zip(objs, rows):
        assert (o["len"], o["caplen"]) == (int(flen), int(caplen))
        if "ip" in o and (s4 or s6) and "," not in s4 + s6:
            assert (o["ip"]["src"], o["ip"]["dst"]) == ((s4, d4) if s4 else (s6, d6))
    r = run_fcap(["-r", str(path), "--json", "-c", "1"])
    assert len(_lines(r.stdout.decode())) == min(1, len(rows))


def test_encoder_never_raises_on_the_corpus():
    """Every packet of every corpus file (many damaged on purpose) encodes to one JSON line without an exception
    and without a null."""
    from fcap.api import file_packet
    from fcap.errors import PcapFormatError
    from fcap.files.pcapread import read
    from fcap.text.jsonout import packet_line
    if not CORPUS.is_dir():
        pytest.skip(f"{CORPUS} is not there")
    n = 0
    for path in sorted(CORPUS.iterdir()):
        try:
            for rec in read(path):
                line = packet_line(file_packet(rec))
                assert line.endswith("\n") and line.count("\n") == 1
                _lines(line)
                n += 1
        except (PcapFormatError, OSError):
            pass   # (a damaged file: the reader's error, not the encoder's)
    assert n > 5000


_LINE_PORTS = re.compile(r"^IP6? (\S+)\.(\d+) > (\S+)\.(\d+): (Flags|UDP)")


def test_json_says_what_the_printed_line_says():
    """One decoder under both: over every packet of tcpdump's corpus, fcap -r's line and --json's headers agree.
    Where the line shows a datagram's addresses and ports, JSON has them; where the line shows no TCP or UDP header
    (a bad length, a later fragment, a damaged header), JSON has none either."""
    from fcap.api import file_packet
    from fcap.errors import PcapFormatError
    from fcap.files.pcapread import read
    from fcap.text.jsonout import packet_object
    from fcap.text.show import describe
    if not CORPUS.is_dir():
        pytest.skip(f"{CORPUS} is not there")
    compared = 0
    for path in sorted(CORPUS.iterdir()):
        try:
            for rec in read(path):
                p = file_packet(rec)
                line, o = describe(bytes(p.data), p.linktype, p.orig_len), packet_object(p)
                for name in ("tcp", "udp"):
                    if name in o:
                        assert f"{o[name]['sport']} > " in line and f"{o[name]['dport']}: " in line, (line, o)
                m = _LINE_PORTS.match(line)
                if m is None:
                    continue
                layer = o.get("tcp" if m[5] == "Flags" else "udp")
                assert layer is not None and "ip" in o, (path.name, line, o)
                assert (o["ip"]["src"], str(layer["sport"]), o["ip"]["dst"], str(layer["dport"])) == m.groups()[:4]
                compared += 1
        except (PcapFormatError, OSError):
            pass
    assert compared > 1000


_UDP = bytes.fromhex("03e807d000080000")   # 1000 > 2000, no payload
_UDP4 = bytes.fromhex("4500001c000100004011f97c7f0000017f000001") + _UDP
_UDP6 = bytes.fromhex("6000000000081140") + (bytes(15) + b"\x01") * 2 + _UDP


@pytest.mark.parametrize("linktype, head, ip", [
    (0, (2).to_bytes(4, "little"), _UDP4), (0, (30).to_bytes(4, "little"), _UDP6),
    (108, (2).to_bytes(4, "big"), _UDP4), (108, (24).to_bytes(4, "big"), _UDP6), (12, b"", _UDP4),
    (14, b"", _UDP4), (101, b"", _UDP6), (228, b"", _UDP4)],
    ids=["NULL-4", "NULL-6", "LOOP-4", "LOOP-6", "12", "14", "RAW", "IPV4"])
def test_link_types_print_and_encode_as_tcpdump_reads_them(tmp_path, linktype, head, ip):
    """A datagram under each link type fcap decodes (fcap.files.linktypes.FRAMING), and under 12 and 14 (the DLT_RAW
    of Linux, which libpcap reads a file's 12 as, and of OpenBSD, which it does not know): fcap -r prints tcpdump's
    line, and --json has the IP and UDP headers exactly where tcpdump decodes them."""
    import struct

    from conftest import need_tool
    tcpdump = need_tool("tcpdump")
    path = tmp_path / f"{linktype}.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype)
                     + struct.pack("<IIII", 1, 0, len(head + ip), len(head + ip)) + head + ip)
    theirs = subprocess.run([tcpdump, "-nn", "-t", "-r", str(path)], capture_output=True, text=True, timeout=60)
    ours = run_fcap(["-nn", "-t", "-r", str(path)])
    decoded = theirs.returncode == 0 and "UDP" in theirs.stdout
    assert decoded == (linktype != 14), theirs.stdout + theirs.stderr
    if decoded:
        assert ours.stdout.decode() == theirs.stdout
    o = _lines(run_fcap(["-r", str(path), "--json"]).stdout.decode())[0]
    assert ("ip" in o and o["udp"] == {"sport": 1000, "dport": 2000}) == decoded, o
    if linktype in (0, 108):
        assert o["link"]["family"] == int.from_bytes(head, "little" if linktype == 0 else "big")


def test_absent_fields_are_left_out():
    """A packet read from a pcap (no metadata) and cut short: only what is known."""
    from fcap.text.jsonout import packet_object
    from fcap.packet import Packet
    ip = bytes.fromhex("4500003c000040004006") + b"\0\0" + bytes([10, 0, 0, 1, 10, 0, 0, 2])
    p = Packet(ts_ns=5, point=None, data=ip + b"\x00\x50", orig_len=60, linktype=101)
    o = packet_object(p)
    assert o == {"ts_ns": 5, "len": 60, "caplen": 22, "linktype": 101,
                 "ip": {"version": 4, "src": "10.0.0.1", "dst": "10.0.0.2", "proto": 6, "ttl": 64, "len": 60}}


def test_dumps_are_typed_live_and_read_back(root, sink, tmp_path):
    """--dump 'skb->dev' and 'skb->len': typed values (an object with the device's name, a number), the same in the
    live line and in -r --json of the file written with them."""
    args = ["-i", "dev:queue", "--dump", "skb->dev", "--dump", "skb->len", "-c", "1", f"udp port {sink.port}"]
    fc = start_fcap(["--json"] + args, stdout=subprocess.PIPE)
    path = tmp_path / "d.pcapng"
    wr = start_fcap(args[:-1] + ["-w", str(path), args[-1]])
    try:
        send_udp("127.0.0.1", sink.port, [b"x" * 33])
        assert fc.wait() == 0 and wr.wait() == 0, fc.stderr + wr.stderr
        (o,) = _lines(fc.p.stdout.read().decode())
    finally:
        fc.kill()
        wr.kill()
    d = o["dumps"]
    assert d["skb->dev"]["name"] == "lo" and d["skb->dev"]["ifindex"] == 1 and isinstance(d["skb->len"], int)
    (back,) = _lines(run_fcap(["-r", str(path), "--json"]).stdout.decode())
    assert back["dumps"] == d
