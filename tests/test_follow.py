"""Following packets: globs of points, semantic points, drops with their reasons, --track, per-point statistics
blocks, `fcap path` and `fcap drops`, on real traffic (lo, and veth pairs into namespaces of the test's own).

On a kernel that refuses fentry (this host) the points are tracepoints; the tests marked for fentry run in the
guests (tests/vm/run 6.1 -k fentry)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from conftest import kernel_refusal, need_root, need_tool, require_kind

from netns import SLOW, bpf_ids_of, flow_of, read_packets, run_fcap, start_fcap, stop_helper
from tsharkutil import tshark_rows


def _listed(pattern: str) -> list[str]:
    r = run_fcap(["list-devices", pattern, "--json"])
    assert r.returncode == 0, r.stderr.decode()
    return [i["point"] for i in json.loads(r.stdout)]


def _stats(path) -> list:
    from fcap.files.pcapread import InterfaceStats, read
    return [r for r in read(path, stats=True) if isinstance(r, InterfaceStats)]


def _udp(dst: str, port: int, n: int, size: int = 20) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(n):
            s.sendto(b"f" * size, (dst, port))


# ---- globs ---------------------------------------------------------------------------------------------------

def test_glob_of_tracepoints_attaches_every_match(tmp_path, root):
    """-i 'tp_btf/net_dev_*': one program and link per match, the listening line names each, the file has one
    interface per match (in list-devices order) and an Interface Statistics Block for each; a datagram on lo is
    seen at several of them with one packet id."""
    want = _listed("tp_btf/net_dev_*")
    assert len(want) >= 2, want
    path = tmp_path / "g.pcapng"
    port = 40000 + os.getpid() % 20000
    f = start_fcap(["-i", "tp_btf/net_dev_*", "-w", str(path), f"udp port {port}"])
    try:
        line = f.wait_for("^listening on ")
        ids = bpf_ids_of(f.pid)
        _udp("127.0.0.1", port, 3)
        time.sleep(0.3)
    finally:
        f.stop()
    assert f.p.returncode == 0, f.stderr
    assert line.startswith("listening on " + ", ".join(want) + ", "), line
    assert len(ids["prog"]) >= len(want) and len(ids["link"]) >= len(want), ids
    from fcap.files.pcapread import read
    recs = list(read(path))
    by_id: dict[int, set] = {}
    for r in recs:
        by_id.setdefault(r.packet_id, set()).add(r.iface_name)
    assert len(recs) >= 3 and any(len(points) >= 2 for points in by_id.values()), by_id
    stats = _stats(path)
    assert [s.iface_name for s in stats] == want
    for s in stats:
        n = sum(1 for r in recs if r.iface_name == s.iface_name)
        assert s.filteraccept == n and s.ifdrop == 0 and s.ifrecv >= n, (s, n)
        assert s.start_ns <= min(r.ts_ns for r in recs) and s.end_ns >= max(r.ts_ns for r in recs), s


def test_glob_past_a_screenful_is_counted(tmp_path, root):
    """-i 'tp_btf/*': every tracepoint taking an skb, attached; past a screenful the listening line counts them."""
    want = _listed("tp_btf/*")
    f = start_fcap(["-i", "tp_btf/*", "-w", str(tmp_path / "all.pcapng")])
    try:
        line = f.wait_for("^listening on ")
        links = len(bpf_ids_of(f.pid)["link"])
    finally:
        f.stop()
    assert f.p.returncode == 0, f.stderr
    if len(want) > 24:
        assert line.startswith(f"listening on {len(want)} points: tp_btf/* ({len(want)}), "), line
    from fcap.kernel.track import FREE_POINTS, MEMORY_POINTS   # (and the identity map's helpers: fcap.kernel.track)
    assert len(want) <= links <= len(want) + len(FREE_POINTS) + len(MEMORY_POINTS), (links, len(want))


def test_glob_skips_matches_a_predicate_cannot_serve(tmp_path, root):
    """--where over an argument only some matches have: the others are skipped and said so in one line."""
    want = _listed("tp_btf/*_skb")
    from fcap.points.spec import resolve
    have = [p for p in want if "location" in [q.name for q in resolve(p).params]]
    if not have or len(have) == len(want):
        pytest.skip(f"needs some of {want} with a 'location' argument and some without")
    f = start_fcap(["-i", "tp_btf/*_skb", "--where", "location != 0", "-w", str(tmp_path / "s.pcapng")])
    try:
        line = f.wait_for("^listening on ")
        skipped = f.wait_for("^fcap: skipped ")
    finally:
        f.stop()
    assert line.startswith("listening on " + ", ".join(have) + ", "), line
    assert skipped.startswith(f"fcap: skipped {len(want) - len(have)} of {len(want)} points: "), skipped
    assert "no argument 'location'" in skipped, skipped


@pytest.mark.parametrize("spec, words", [
    ("tp_btf/no_such_*", ["no tracepoint taking a struct sk_buff * matches 'no_such_*'"]),
    ("fentry/zz_no_such_*", ["no function taking a struct sk_buff * matches 'zz_no_such_*'"]),
    ("zz_no_such_*", ["no tracepoint or function"]),
    ("tp_btf/net_dev_*:nope", ["with a struct sk_buff * argument called 'nope'"]),
    ("ip:sned", ["ip:sned: no such semantic point", "did you mean ip:send"]),
])
def test_bad_points_are_one_line(spec, words, tmp_path, root):
    r = run_fcap(["-i", spec, "-w", str(tmp_path / "x.pcapng")])
    err = r.stderr.decode()
    assert r.returncode == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    assert not (tmp_path / "x.pcapng").exists()


# ---- semantic points -------------------------------------------------------------------------------------------

def test_semantic_points_map_to_this_kernels_hooks(root):
    """list-devices --semantic: every semantic point, mapped to fentry where this kernel allows it, else to a
    tracepoint; a point this kernel cannot serve says why."""
    from fcap.points.semantic import TABLE
    r = run_fcap(["list-devices", "--semantic", "--json"])
    assert r.returncode == 0, r.stderr.decode()
    rows = {x["point"]: x for x in json.loads(r.stdout)}
    assert set(rows) == set(TABLE)
    text = run_fcap(["list-devices", "--semantic"]).stdout.decode()
    assert len(text.splitlines()) == len(TABLE)
    fentry = kernel_refusal("fentry") is None
    assert rows["skb:drop"]["hooks"] == ["tp_btf/kfree_skb"]
    if fentry:
        assert rows["ip:send"]["hooks"] == ["fentry/ip_output"], rows["ip:send"]
        assert rows["dev:queue"]["hooks"][0].startswith("fentry/"), rows["dev:queue"]
    else:
        assert rows["dev:queue"]["hooks"] == ["tp_btf/net_dev_queue"], rows["dev:queue"]
        assert rows["dev:receive"]["hooks"] == ["tp_btf/netif_receive_skb"]
        if kernel_refusal("kprobe") is not None:
            assert rows["ip:send"]["hooks"] == [] and rows["ip:send"]["refused"], rows["ip:send"]
            line = next(ln for ln in text.splitlines() if ln.startswith("ip:send "))
            assert "this kernel cannot serve it: fentry/ip_output: this kernel refuses fentry" in line, line


def test_semantic_point_names_the_interface(tmp_path, root):
    """-i skb:drop -i dev:queue: the interfaces are called by the semantic names, described by the hook chosen."""
    path = tmp_path / "s.pcapng"
    f = start_fcap(["-i", "skb:drop", "-i", "dev:queue", "-w", str(path), "udp port 9"])
    try:
        line = f.wait_for("^listening on ")
        _udp("127.0.0.1", 9, 2)
        time.sleep(0.3)
    finally:
        f.stop()
    assert re.match(r"listening on skb:drop \(tp_btf/kfree_skb\), dev:queue \((fentry|tp_btf)/", line), line
    names = [(s.iface_name) for s in _stats(path)]
    assert names == ["skb:drop", "dev:queue"]
    need_tool("tshark")
    descr = dict(row for row in tshark_rows(path, "frame.interface_name", "frame.interface_description")
                 if len(row) == 2)
    assert descr["skb:drop"].startswith("tp_btf/kfree_skb: void kfree_skb(struct sk_buff *skb, void *location"), descr
    assert re.match(r"(fentry/__dev_queue_xmit|tp_btf/net_dev_queue): ", descr["dev:queue"]), descr


# ---- drops ----------------------------------------------------------------------------------------------------

DROPPER = r"""
import socket, sys, time
peer = sys.argv[1]
full = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
full.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
full.bind((peer, 0))
print(full.getsockname()[1], flush=True)
sys.stdin.readline()
"""


def _drop_traffic(v, closed: int, tcp_closed: int, fport: int) -> None:
    _udp(v.peer, closed, 3)
    for _ in range(2):
        try:
            socket.create_connection((v.peer, tcp_closed), timeout=2).close()
        except OSError:
            pass
    _udp(v.peer, fport, 20, size=1000)


def _drop_records(path) -> dict[str, list]:
    """The test's drop records by kind (udp closed, tcp refused, udp full): [(reason, at)]."""
    out: dict[str, list] = {}
    for p in read_packets(path):
        m = re.search(r" reason=(\S+) at=(\S+)", p.comment or "")
        f = flow_of(p)
        if m and f is not None:
            out.setdefault((f.proto, f.dport), []).append(m.groups())
    return out


@contextlib.contextmanager
def _dropper(v, script: str):
    """The helper script run in the namespace: yields the port it printed; ended (its stdin closed) after."""
    helper = subprocess.Popen(v.exec(sys.executable, "-c", script, v.peer), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        yield int(helper.stdout.readline())
    finally:
        stop_helper(helper)


def test_drops_carry_their_reason_and_location(tmp_path, veth_ns):
    """A namespace over a veth pair: UDP to a closed port, TCP to a closed port, UDP to a full socket. At
    -i skb:drop each record's comment names the reason (from this kernel's BTF) and where (from kallsyms):
    NO_SOCKET in UDP's receive, NO_SOCKET in TCP's, SOCKET_RCVBUFF where UDP queues; fcap path ends each packet
    with them."""
    from fcap.kernel.drops import reason_enum
    enum = reason_enum()
    if enum is None or "SKB_DROP_REASON_SOCKET_RCVBUFF" not in enum.values:
        pytest.skip("this kernel names no drop reasons (enum skb_drop_reason, Linux 5.17+)")
    v = veth_ns
    with _dropper(v, DROPPER) as fport:
        closed, tcp_closed = 7001, 7002
        path = tmp_path / "d.pcapng"
        f = start_fcap(["-i", "skb:drop", "-w", str(path), f"host {v.peer}"])
        try:
            _drop_traffic(v, closed, tcp_closed, fport)
            time.sleep(0.5)
        finally:
            f.stop()
    assert f.p.returncode == 0, f.stderr
    got = _drop_records(path)
    udp_closed, tcp, full = got.get((17, closed), []), got.get((6, tcp_closed), []), got.get((17, fport), [])
    assert len(udp_closed) == 3 and all(r == "NO_SOCKET" and "udp" in at for r, at in udp_closed), got
    assert tcp and all(r == "NO_SOCKET" and "tcp" in at for r, at in tcp), got
    assert full and all(r == "SOCKET_RCVBUFF" and "+0x" in at for r, at in full), got
    out = run_fcap(["path", str(path)]).stdout.decode()
    assert out.count("  dropped: NO_SOCKET at ") >= 5 and "  dropped: SOCKET_RCVBUFF at " in out, out


def test_fcap_drops_counts_per_reason_and_location(tmp_path, root):
    """fcap drops -- CMD: a table of drops per reason and location, with the command's drops in it; with -w
    the drops are written too."""
    from fcap.kernel.drops import reason_enum
    if reason_enum() is None:
        pytest.skip("this kernel names no drop reasons")
    port = 30000 + os.getpid() % 20000
    send = [sys.executable, "-c", f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                                  f"[s.sendto(b'x', ('127.0.0.1', {port})) for _ in range(25)]"]
    path = tmp_path / "d.pcapng"
    for extra in ([], ["-w", str(path), f"udp port {port}"]):
        r = run_fcap(["drops", *extra, "--", *send])
        out, err = r.stdout.decode(), r.stderr.decode()
        assert r.returncode == 0, err
        lines = out.splitlines()
        assert re.match(r"\d+ packets? dropped$", lines[0]) and lines[1].split() == ["count", "reason", "location"]
        row = [ln.split() for ln in lines[2:] if ln.split()[1:2] == ["NO_SOCKET"] and "udp" in ln.split()[2]]
        assert row and int(row[0][0]) >= 25, out
    recs = read_packets(path)
    assert len(recs) == 25 and all(" reason=NO_SOCKET at=" in p.comment for p in recs)


def test_where_reason_by_short_name(tmp_path, root):
    """--where 'reason == NO_SOCKET' (the name without SKB_DROP_REASON_) keeps the datagrams to a closed port."""
    from fcap.kernel.drops import reason_enum
    if reason_enum() is None:
        pytest.skip("this kernel names no drop reasons")
    port = 30000 + (os.getpid() + 7) % 20000
    path = tmp_path / "w.pcapng"
    f = start_fcap(["-i", "tp_btf/kfree_skb", "--where", "reason == NO_SOCKET", "-w", str(path), f"udp port {port}"])
    try:
        _udp("127.0.0.1", port, 4)
        time.sleep(0.3)
    finally:
        f.stop()
    recs = read_packets(path)
    assert len(recs) == 4 and all("reason=NO_SOCKET" in p.comment for p in recs)


# ---- --track and fcap path --------------------------------------------------------------------------------------

def _track_run(tmp_path, v, track: bool, port: int) -> tuple:
    path = tmp_path / f"t{int(track)}.pcapng"
    args = ["-i", "dev:queue", "-i", "dev:receive", "-i", "skb:drop", "--ifname", v.a, "-w", str(path),
            f"udp port {port}"]
    f = start_fcap(args + (["--track"] if track else []))
    try:
        _udp(v.peer, port, 3)
        _udp(v.peer, port + 1, 3)
        time.sleep(0.5)
    finally:
        f.stop()
    assert f.p.returncode == 0, f.stderr
    return read_packets(path), path, f.stderr


def test_track_follows_the_skb_across_the_namespace(tmp_path, veth_ns):
    """--track --ifname <host side> 'udp port P': each datagram to the namespace's closed port P is captured at
    dev:queue (host side), dev:receive and skb:drop (inside the namespace, where --ifname is false: only tracking
    keeps them), with one packet id, in that order; nothing of port P+1 (it never passed the filter); without
    --track only dev:queue. fcap path prints the three points in order, then the reason."""
    v = veth_ns
    port = 7100 + os.getpid() % 500 * 2
    recs, path, err = _track_run(tmp_path, v, True, port)
    ports = {flow_of(p).dport for p in recs}
    assert ports == {port}, ports
    by_id: dict[int, list] = {}
    for p in sorted(recs, key=lambda p: p.ts_ns):
        by_id.setdefault(p.packet_id, []).append(p.iface_name)
    triple = ["dev:queue", "dev:receive", "skb:drop"]   # (a freed skb's address may serve the next datagram)
    assert len(recs) == 9 and all(seq == triple * (len(seq) // 3) for seq in by_id.values()), by_id
    assert re.search(r"^3 packets tracked \(\d+ clones\), 0 tracking entries evicted", err, re.M), err
    out = run_fcap(["path", str(path)]).stdout.decode()
    blocks = [b for b in out.split("packet 0x")[1:]]
    assert len(blocks) == 3, out
    from fcap.kernel.drops import reason_enum
    end = "  dropped: NO_SOCKET at " if reason_enum() is not None else "  dropped: at __udp4_lib_rcv+0x"
    for b in blocks:
        lines = b.splitlines()
        at = [i for i, ln in enumerate(lines) if re.match(r"^ +(\d\d:|\+\d+ ns )", ln)]
        assert [lines[i].split()[-1] for i in at] == ["dev:queue", "dev:receive", "skb:drop"], b
        # the host side's device, then the namespace's: each under its heading
        headings = [ln.strip() for ln in lines if ln.startswith("  -- ")]
        assert len(headings) == 2 and all(re.match(r"-- ifindex \d+, netns \d+ --$", h) for h in headings), b
        assert re.match(r"  3 points in \d+ ns$", lines[1]) and lines[at[-1] + 1].startswith(end), b
    assert "3 packets: 3 dropped, 0 consumed, 0 in flight" in out
    assert re.search(r"^dev:queue -> dev:receive +3 +\d+ +\d+$", out, re.M), out
    plain, _path, _err = _track_run(tmp_path, v, False, port)
    assert {p.iface_name for p in plain} == {"dev:queue"} and len(plain) == 3


def test_track_evictions_are_counted(tmp_path, veth_ns):
    """A tracking map of 4 entries and 8 datagrams that stay queued (a socket that never reads): the map evicts,
    and the summary says how much."""
    v = veth_ns
    with _dropper(v, DROPPER.replace("SO_RCVBUF, 1", "SO_RCVBUF, 1 << 20")) as port:
        f = start_fcap(["-i", "dev:queue", "--track", "--track-max", "4", "-w", str(tmp_path / "e.pcapng"),
                        f"udp port {port}"])
        try:
            _udp(v.peer, port, 8)
            time.sleep(0.5)
        finally:
            f.stop()
    m = re.search(r"^8 packets tracked \(\d+ clones\), (\d+) tracking entries evicted \(map of 4\)", f.stderr, re.M)
    assert m and int(m.group(1)) >= 8, f.stderr


def test_a_drop_point_is_one_rule_for_the_verdict_and_the_path():
    """Pure: the points every packet of which is dropped, as a point names them and as a file's interface does
    (fcap.kernel.drops: epb_verdict's TC_ACT_SHOT and `fcap path`'s "dropped" read one list)."""
    from fcap.commands.path_report import Hop, end_of
    from fcap.kernel.drops import DROP_POINTS, drops_every_packet
    names = ["skb:drop", "tp_btf/kfree_skb", "fentry/kfree_skb_list_reason", "kprobe.multi/sk_skb_reason_drop",
             "fentry/kfree_skb_reason:vmlinux"] + sorted(DROP_POINTS)
    assert all(drops_every_packet(n) and end_of(Hop(1, 1, n)) == "dropped" for n in names)
    assert not any(drops_every_packet(n) or end_of(Hop(1, 1, n)) == "dropped"
                   for n in ["tp_btf/consume_skb", "fentry/kfree_skb_partial", "dev:queue", "skb:consume"])


def test_path_streams_in_time_order():
    """Pure: hops out of order (within the window) come out in order; a packet id seen again at a point and
    device it passed is the same packet, unless the id is an skb's address (files before packet ids: then a new
    packet); percentiles are nearest-rank; the summary counts the ends."""
    from fcap.commands.path_report import Hop, Tracker
    t = Tracker(window_ns=1000, idle_ns=10**12)
    skb = 0xffff893bc13a5c00
    hops = [Hop(110, 1, "b", 2), Hop(100, 1, "a", 1), Hop(130, 1, "skb:drop", 2, drop="NO_SOCKET at f+0x1"),
            Hop(200, skb, "a", 1), Hop(230, skb, "a", 1), Hop(260, skb, "skb:consume", 1), Hop(300, 2, "a", 1),
            Hop(320, 2, "a", 1), Hop(5000, 3, "a", 1)]
    out = "".join(text for h in hops for text in t.feed(h)) + "".join(t.finish())
    packets = out.split("packet 0x")[1:]
    assert [p.split(":")[0] for p in packets] == ["1", f"{skb:x}", f"{skb:x}", "2", "3"], out
    assert "  2 points in 20 ns" in packets[3]
    assert packets[0].splitlines()[1:] == [
        "  3 points in 30 ns", "  -- ifindex 1 --", "  00:00:00.000000100  a", "  -- ifindex 2 --",
        "              +10 ns  b", "              +20 ns  skb:drop", "  dropped: NO_SOCKET at f+0x1"], out
    assert "+30 ns  skb:consume" in packets[2] and packets[2].rstrip().endswith("consumed")
    assert "in flight at the end" in packets[4]
    assert "5 packets: 1 dropped, 1 consumed, 3 in flight" in out
    assert re.search(r"^a -> b +1 +10 +10$", out, re.M) and "dropped 1: NO_SOCKET at f+0x1" in out


def test_a_paths_title_is_its_most_complete_record():
    """Pure: a packet's path is titled by its first record whose bytes decode whole (at a function before the
    network header is set, the bytes read as 'IP bad-len 0'), made by the printer from real bytes; a packet
    damaged everywhere keeps its first record's line."""
    from fcap.commands.path_report import Hop, Tracker
    from fcap.text.show import describe
    import struct
    sll2 = struct.pack(">HHIHBB8s", 0x0800, 0, 1, 772, 0, 6, bytes(8))     # LINUX_SLL2: IPv4, ifindex 1, lo
    udp = bytes.fromhex("4500001c000100004011f97cc6120001c6120002d431003500080000")   # (198.18.0.1 -> .2)
    early = describe(sll2 + b"\x45" + bytes(19) + udp[20:], 276, 48)   # the IP header not written yet
    whole = describe(sll2 + udp, 276, 48)
    assert "bad-len 0" in early and "198.18" not in early, early
    assert "IP 198.18.0.1.54321 > 198.18.0.2.53" in whole, whole
    t = Tracker(window_ns=1000, idle_ns=10**12)
    hops = [Hop(100, 1, "kprobe/udp4_hwcsum", line=early), Hop(110, 1, "tp_btf/net_dev_queue", line=whole),
            Hop(120, 1, "skb:consume", line=whole), Hop(200, 2, "a", line=early), Hop(210, 2, "skb:consume",
                                                                                       line=early)]
    out = "".join(text for h in hops for text in t.feed(h)) + "".join(t.finish())
    titles = [line for line in out.splitlines() if line.startswith("packet 0x")]
    assert titles == [f"packet 0x1: {whole}", f"packet 0x2: {early}"], out


def test_path_needs_a_file_fcap_wrote(tmp_path, root):
    """fcap path on a pcap, a foreign pcapng, or not a capture at all: one line saying what it needs."""
    from fcap.files.pcapfile import open_writer
    pcap, png, junk = tmp_path / "a.pcap", tmp_path / "b.pcapng", tmp_path / "c.txt"
    for path, fmt in ((pcap, "pcap"), (png, "pcapng")):
        with open(path, "wb") as fh:
            w = open_writer(fh, fmt)
            w.add_interface("eth0", 1)
            w.write(10**18, b"\0" * 60, 60)
            w.close()
    junk.write_text("hello")
    for path, words in ((pcap, "a pcap file has no packet ids or points"),
                        (png, "its packets carry no fcap packet ids and comments"),
                        (junk, "neither pcap nor pcapng"), (tmp_path / "none", "No such file")):
        r = run_fcap(["path", str(path)])
        err = r.stderr.decode()
        assert r.returncode == 1 and len(err.splitlines()) == 1 and words in err, err


# ---- statistics blocks -------------------------------------------------------------------------------------------

def test_interface_statistics_round_trip(tmp_path):
    """Pure: every ISB option written comes back; the other readers accept the file (tshark reads it, capinfos
    counts one statistics entry per interface)."""
    from fcap.files.pcapfile import PcapngWriter
    from fcap.files.pcapread import InterfaceStats, read
    path = tmp_path / "isb.pcapng"
    with open(path, "wb") as fh:
        w = PcapngWriter(fh)
        w.add_interface("a", 1)
        w.add_interface("b", 1)
        w.write(1_700_000_000_123_456_789, b"\0" * 60, 60, iface=1)
        w.write_isb(0, 1_700_000_001_000_000_000, start_ns=1_700_000_000_000_000_000, end_ns=1_700_000_001_000_000_000,
                    ifrecv=10, ifdrop=2, filteraccept=7, osdrop=1, usrdeliv=5, comment="x")
        w.write_isb(1, 1_700_000_001_000_000_001, ifrecv=2**40)
        w.close()
    got = [r for r in read(path, stats=True) if isinstance(r, InterfaceStats)]
    assert got == [InterfaceStats(0, 1_700_000_001_000_000_000, "a", 1_700_000_000_000_000_000,
                                  1_700_000_001_000_000_000, 10, 2, 7, 1, 5, "x"),
                   InterfaceStats(1, 1_700_000_001_000_000_001, "b", ifrecv=2**40)]
    assert len(list(read(path))) == 1   # (without stats: packets only)
    if need_tool_or_none("capinfos"):
        out = subprocess.run(["capinfos", str(path)], capture_output=True, text=True, timeout=60).stdout
        assert out.count("Number of stat entries = 1") == 2, out
    if need_tool_or_none("tshark"):
        r = subprocess.run(["tshark", "-r", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr


def need_tool_or_none(name: str) -> str | None:
    import shutil
    return shutil.which(name)


# ---- fentry globs (kernels that allow trampolines: the guests) -------------------------------------------------------

def test_fentry_glob_follows_a_ping(tmp_path):
    """-i 'fentry/ip_*': every match the kernel allows is attached (the others said in one line), and a ping's
    echo request is seen with one packet id at ip_output, then ip_finish_output, then (on lo, the same skb)
    ip_rcv, then ip_local_deliver, in that order."""
    require_kind("fentry")
    need_tool("ping")
    want = _listed("fentry/ip_*")
    path = tmp_path / "ip.pcapng"
    f = start_fcap(["-i", "fentry/ip_*", "-w", str(path), "icmp"], )
    try:
        line = f.wait_for("^listening on ", timeout=600 * SLOW)
        links = len(bpf_ids_of(f.pid)["link"])
        subprocess.run(["ping", "-n", "-c", "2", "-i", "0.3", "-p", "fc0ffee0", "127.0.0.1"], capture_output=True,
                       timeout=30)
        time.sleep(0.5)
    finally:
        f.stop(timeout=600 * SLOW)
    assert f.p.returncode == 0, f.stderr
    m = re.match(r"listening on (\d+) points: fentry/ip_\* \((\d+)\)", line)
    attached = int(m.group(1)) if m else line.count("fentry/ip_")
    skipped = re.search(r"^fcap: skipped (\d+) of (\d+) points", f.stderr, re.M)
    assert attached + (int(skipped.group(1)) if skipped else 0) == len(want), (line, f.stderr)
    # a link per point, or per group where the kernel runs many functions through one (fcap.live.multi), and the
    # packet ids' helpers
    assert 0 < links <= attached + 8, (links, attached)
    pkts = [p for p in read_packets(path) if b"\xfc\x0f\xfe\xe0" in p.l3 and p.l3[20:21] == b"\x08"]
    by_id: dict[int, list] = {}
    for p in sorted(pkts, key=lambda p: p.ts_ns):
        by_id.setdefault(p.packet_id, []).append(p.iface_name.split("/", 1)[1])
    assert by_id, f"no echo request seen: {f.stderr}"
    for seq in by_id.values():
        order = [seq.index(n) for n in ("ip_output", "ip_finish_output", "ip_rcv", "ip_local_deliver") if n in seq]
        assert len(order) >= 3 and order == sorted(order), seq


def test_semantic_points_are_fentry_where_allowed(tmp_path):
    """Where the kernel allows trampolines, ip:send is fentry/ip_output and captures the datagrams sent."""
    require_kind("fentry")
    need_root()
    path = tmp_path / "s.pcapng"
    port = 30000 + (os.getpid() + 3) % 20000
    f = start_fcap(["-i", "ip:send", "-w", str(path), f"udp port {port}"])
    try:
        line = f.wait_for("^listening on ")
        _udp("127.0.0.1", port, 3)
        time.sleep(0.3)
    finally:
        f.stop()
    assert line.startswith("listening on ip:send (fentry/ip_output), "), line
    assert len(read_packets(path)) == 3


def test_live_path(tmp_path, root):
    """--path: the paths as fcap path prints them, live, on stdout; the capture's summary on stderr."""
    port = 30000 + (os.getpid() + 11) % 20000
    send = [sys.executable, "-c", f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                                  f"[s.sendto(b'x', ('127.0.0.1', {port})) for _ in range(2)]"]
    r = run_fcap(["-i", "dev:queue", "-i", "dev:receive", "-i", "skb:drop", "--track", "--path", f"udp port {port}",
                  "--", *send])
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    assert out.count("packet 0x") == 2 and out.count("  dropped: ") == 2, out
    assert "2 packets: 2 dropped, 0 consumed, 0 in flight" in out and "dev:queue -> dev:receive" in out, out
    assert re.search(r"^6 packets captured$", err, re.M), err


def test_drop_point_without_reason_says_so(tmp_path, root):
    """Where kfree_skb has no reason argument (before 5.17) fcap says so in one line; elsewhere it says nothing."""
    from fcap.kernel.drops import reason_arg
    from fcap.points.spec import resolve
    f = start_fcap(["-i", "skb:drop", "-w", str(tmp_path / "n.pcapng")])
    f.stop()
    note = [ln for ln in f.lines if "has no drop reason argument" in ln]
    if reason_arg(resolve("tp_btf/kfree_skb")) is None:
        assert len(note) == 1 and note[0].startswith("fcap: note: tp_btf/kfree_skb on this kernel"), f.stderr
    else:
        assert not note, f.stderr
