"""The Python API: fcap.capture() as a context manager and iterator of fcap.Packet (counts, metadata, scapy and
dpkt views, where/linktype/dump), detaching on leaving the block, on an exception and on garbage collection
(nothing of ours left in the kernel: bpftool), errors as fcap exception types; fcap.read() over files fcap wrote."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import need_root, need_tool

from netns import ROOT, bpf_ids_of, send_udp, start_fcap, subprocess_env

POINT = "tp_btf/net_dev_queue"
SO_MARK, SO_PRIORITY = 36, 12


def _send_later(port: int, sizes: list[int], mark: int = 0, delay: float = 0.3, priority: int = 0) -> threading.Thread:
    def run():
        time.sleep(delay)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            if mark:
                s.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
            s.setsockopt(socket.SOL_SOCKET, SO_PRIORITY, priority)
            for n in sizes:
                s.sendto(b"a" * n, ("127.0.0.1", port))
                time.sleep(0.02)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _prog_ids() -> set[int]:
    return bpf_ids_of(os.getpid())["prog"]


def _gone(ids: set[int]) -> bool:
    """None of these program ids is loaded any more (bpftool's view)."""
    need_tool("bpftool")
    for i in ids:
        r = subprocess.run(["bpftool", "prog", "show", "id", str(i)], capture_output=True, text=True, timeout=30)
        if r.returncode == 0:
            return False
    return True


def test_import_is_cheap():
    code = "import fcap, sys; print(sorted(m for m in sys.modules if m.startswith(('fcap.', 'bpf'))))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "['fcap.errors']", r.stdout + r.stderr


def test_count_metadata_and_views(sink):
    import fcap
    mark = 0x5A5
    with fcap.capture(POINT, filter=f"udp and dst port {sink.port}", count=4, timeout=30) as cap:
        assert not cap.closed
        t = _send_later(sink.port, [10, 20, 30, 40, 50, 60], mark=mark, priority=5)
        pkts = list(cap)
        assert cap.closed            # the count reached: detached at once
    t.join()
    assert [len(p.data) for p in pkts] == [14 + 28 + n for n in (10, 20, 30, 40)]
    comm = open("/proc/self/comm").read().strip()
    for p in pkts:
        assert isinstance(p, fcap.Packet) and p.point == POINT and p.linktype == 1
        assert (p.pid, p.comm, p.mark, p.ifindex, p.priority) == (os.getpid(), comm, mark,
                                                                  socket.if_nametoindex("lo"), 5)
        assert p.tid != p.pid and p.netns == os.stat("/proc/self/ns/net").st_ino and p.skb > 0xFFFF000000000000
        assert abs(p.ts_ns - time.time_ns()) < 60 * 10**9 and p.orig_len == len(p.data)
        sp = p.scapy()
        assert sp["UDP"].dport == sink.port and sp["IP"].dst == "127.0.0.1"
        dp = p.dpkt()
        assert dp.__class__.__name__ == "Ethernet" and dp.data.data.dport == sink.port
    assert pkts == sorted(pkts, key=lambda p: p.ts_ns)
    assert cap.stats[0] == 4


def test_linktype_where_and_dump(sink):
    import fcap
    with fcap.capture([POINT], filter=f"udp and dst port {sink.port}", linktype="LINUX_SLL2", count=2,
                      where=["skb->len > 500"], dump=["skb->dev->name"], timeout=30) as cap:
        t = _send_later(sink.port, [100, 1000, 200, 2000])
        pkts = list(cap)
    t.join()
    assert [p.orig_len for p in pkts] == [20 + 28 + 1000, 20 + 28 + 2000] and all(p.linktype == 276 for p in pkts)
    assert pkts[0].dpkt().__class__.__name__ == "SLL2" and pkts[0].scapy().haslayer("CookedLinuxV2")
    assert all(p.dumps["skb->dev->name"].value == "lo" for p in pkts)
    assert cap.fallbacks == [], cap.fallbacks   # (the preferred programs load on every kernel of the matrix)


def test_every_predicate_the_command_line_has(sink):
    """pid, comm, mark, ifindex, ifname, netns and direction, tested in the kernel as their flags are (one function
    makes both): all at once they keep exactly this process's marked datagrams; each alone, given another value,
    keeps none of them."""
    import fcap
    mine = dict(pid=os.getpid(), comm=open("/proc/self/comm").read().strip(), mark=7,
                ifindex=socket.if_nametoindex("lo"), ifname="lo", netns=os.stat("/proc/self/ns/net").st_ino,
                direction="out")
    flt = f"udp and dst port {sink.port}"
    with fcap.capture(POINT, filter=flt, count=3, timeout=30, **mine) as cap:
        threads = [_send_later(sink.port, [10, 20, 30], mark=7), _send_later(sink.port, [15, 25, 35])]
        pkts = list(cap)
    for t in threads:
        t.join()
    assert sorted(p.orig_len - 14 - 28 for p in pkts) == [10, 20, 30] and all(p.mark == 7 for p in pkts)
    others = dict(pid=1, comm="no-such-comm", mark=8, ifindex=mine["ifindex"] + 1000, ifname="no-such-dev",
                  netns=1, direction="in")
    for key, value in others.items():
        with fcap.capture(POINT, filter=flt, count=1, timeout=1.0, **{key: value}) as cap:
            t = _send_later(sink.port, [10, 20], mark=7, delay=0.1)
            got = list(cap)
        t.join()
        assert got == [], f"{key}={value!r} kept {len(got)}"


def test_leaving_the_block_detaches_everything(sink):
    import fcap
    before = _prog_ids()
    with fcap.capture(POINT, filter=f"udp and dst port {sink.port}") as cap:
        ours = _prog_ids() - before
        assert ours
        assert cap.next(timeout=0.2) is None          # nothing sent: the time is up, the capture goes on
        assert not cap.closed
    assert cap.closed and _prog_ids() == before and _gone(ours)


def test_an_exception_in_the_block_detaches(sink):
    import fcap
    before = _prog_ids()
    with pytest.raises(ZeroDivisionError):
        with fcap.capture(POINT, filter=f"udp and dst port {sink.port}"):
            ours = _prog_ids() - before
            1 / 0
    assert ours and _prog_ids() == before and _gone(ours)


def test_garbage_collection_detaches(sink):
    import fcap
    before = _prog_ids()
    cap = fcap.capture(POINT, filter=f"udp and dst port {sink.port}")
    ours = _prog_ids() - before
    del cap
    gc.collect()
    assert ours and _prog_ids() == before and _gone(ours)


@pytest.mark.parametrize("kwargs, kind, says", [
    (dict(points="tp_btf/no_such_tracepoint"), "CaptureError", "no tracepoint 'no_such_tracepoint'"),
    (dict(points=POINT, filter="udp port"), "CaptureError", "udp port: "),
    (dict(points=POINT, where=["skb->nope > 1"]), "CaptureError", "struct sk_buff has no member 'nope'"),
    (dict(points=POINT, dump=["skb->nope"]), "PathError", "struct sk_buff has no member 'nope'"),
    (dict(points=POINT, count=0), "UsageError", "count: a positive number"),
    (dict(points=[]), "UsageError", "capture points"),
    (dict(points=POINT, linktype="NOPE"), "UnknownLinkType", "unknown linktype 'NOPE'"),
    (dict(points=POINT, pid="1"), "PredicateError", "pid: a number, 0 or more, not '1'"),
    (dict(points=POINT, ifindex=0), "PredicateError", "ifindex: a number, 1 or more, not 0"),
    (dict(points=POINT, comm=5), "PredicateError", "comm: a name, not 5"),
    (dict(points=POINT, direction="sideways"), "PredicateError", "unknown capture direction `sideways'"),
])
def test_errors_are_fcap_errors(root, kwargs, kind, says):
    import fcap
    before = _prog_ids()
    with pytest.raises(fcap.FcapError) as e:
        fcap.capture(**kwargs)
    assert type(e.value).__name__ == kind and says in str(e.value) and "\n" not in str(e.value)
    assert _prog_ids() == before


def test_read_gives_the_same_packets(sink, tmp_path):
    import fcap
    out = tmp_path / "r.pcapng"
    f = start_fcap(["-i", POINT, "-w", str(out), "-c", "3", f"udp and dst port {sink.port}"])
    try:
        send_udp("127.0.0.1", sink.port, [b"r" * n for n in (5, 6, 7)], pace=0.05)
        assert f.wait() == 0, f.stderr
    finally:
        f.kill()
    pkts = list(fcap.read(out))
    assert [len(p.data) for p in pkts] == [14 + 28 + n for n in (5, 6, 7)]
    for p in pkts:
        assert p.point == POINT and p.linktype == 1 and p.comm == open("/proc/self/comm").read().strip()
        assert p.pid and p.tid and p.ifindex == socket.if_nametoindex("lo") and p.skb and p.netns and p.dumps == {}
        assert p.dpkt().data.data.dport == sink.port
    pcap = tmp_path / "r.pcap"
    f = start_fcap(["-i", POINT, "-w", str(pcap), "-c", "1", f"udp and dst port {sink.port}"])
    try:
        send_udp("127.0.0.1", sink.port, [b"p"])
        assert f.wait() == 0, f.stderr
    finally:
        f.kill()
    (p,) = fcap.read(pcap)
    assert p.point is None and p.pid is None and p.comm is None and p.dpkt().data.data.dport == sink.port


def test_read_decodes_the_comment_on_demand(monkeypatch):
    """Iterating a file's Packets parses no comment; the first metadata attribute asked for parses it once, and
    gives what the comment says; a file Packet equals, pickles and copies as the Packet it stands for."""
    import copy
    import dataclasses
    import pickle

    import fcap
    from fcap.features import comments
    parsed = []
    real = comments.of_text
    monkeypatch.setattr(comments, "of_text", lambda text: parsed.append(text) or real(text))
    pkts = list(fcap.read(ROOT / "pcaps" / "lo-two-points.pcapng"))
    assert len(pkts) > 4 and not parsed
    for p in pkts:
        meta = real(p.comment)
        assert (p.pid, p.comm, p.skb, p.netns) == (meta["pid"], meta["comm"], meta["skb"], meta["netns"])
        assert p.pid == meta["pid"]   # (stored: parsed once)
        plain = fcap.Packet(**{f.name: getattr(p, f.name) for f in dataclasses.fields(fcap.Packet)})
        assert p == plain and plain == p and pickle.loads(pickle.dumps(p)) == p and copy.copy(p) == p
        assert dataclasses.replace(p, pid=p.pid + 1) != p
    assert parsed == [p.comment for p in pkts]


def test_read_errors():
    import fcap
    with pytest.raises(fcap.FcapError, match="No such file"):
        list(fcap.read("/nonexistent/x.pcapng"))
    with pytest.raises(fcap.FcapError, match="neither pcap nor pcapng"):
        list(fcap.read(ROOT / "README.md"))


def test_root_needed_said_as_an_fcap_error():
    if os.geteuid() != 0:
        import fcap
        with pytest.raises(fcap.FcapError):
            fcap.capture(POINT)
        return
    need_root()
    code = ("import fcap\ntry:\n fcap.capture('tp_btf/net_dev_queue')\nexcept fcap.FcapError as e:\n"
            " print('FcapError', e)\n")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                       capture_output=True, text=True, env=subprocess_env(), timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("FcapError "), r.stdout + r.stderr


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_drop_points_name_reason_location_verdict_live_and_read_back(root, tmp_path):
    """A datagram to a closed port at skb:drop: the live Packet and the one read back from fcap's file say the
    same point, reason, location, verdict and comment."""
    import fcap
    port = _closed_port()
    expr = f"udp and dst port {port}"
    with fcap.capture("skb:drop", filter=expr, count=1, timeout=10) as cap:   # (attached when it returns)
        _send_later(port, [11], delay=0.05)
        (live,) = list(cap)
    assert live.point == "skb:drop" and live.verdict == (1, 2)    # eBPF TC (type 1): TC_ACT_SHOT
    assert live.location and "+0x" in live.location
    if live.reason is not None:   # (Linux 5.17+: a reason argument)
        assert live.reason == "NO_SOCKET" and f" reason=NO_SOCKET at={live.location}" in live.comment
    assert live.comment.startswith(f"skb=0x{live.skb:016x} ") and live.packet_id
    out = tmp_path / "d.pcapng"
    f = start_fcap(["-i", "skb:drop", "-w", str(out), "-c", "1", expr])
    try:
        send_udp("127.0.0.1", port, [b"d" * 11])
        assert f.wait() == 0, f.stderr
    finally:
        f.kill()
    (back,) = fcap.read(out)
    assert (back.point, back.reason, back.verdict) == (live.point, live.reason, live.verdict)
    assert back.location.split("+")[0] == live.location.split("+")[0] and back.comment.endswith(back.location)
    assert len(back.data) == len(live.data) and back.packet_id


def test_track_follows_one_packet_under_the_command_lines_names(root, tmp_path, sink):
    """track=True as --track: each datagram's records at dev:queue and dev:receive share one packet id, other
    datagrams have other ids; the points are named as the command line names them, live and read back."""
    import fcap
    expr = f"udp and dst port {sink.port}"
    with fcap.capture(["dev:queue", "dev:receive"], filter=expr, track=True, count=6, timeout=10) as cap:
        _send_later(sink.port, [21, 22, 23], delay=0.05)
        live = list(cap)
    assert len(live) == 6 and {p.point for p in live} == {"dev:queue", "dev:receive"}
    by_id: dict = {}
    for p in live:
        by_id.setdefault(p.packet_id, []).append(p)
    assert len(by_id) == 3, [(p.point, p.packet_id, len(p.data)) for p in live]
    for recs in by_id.values():
        assert sorted(p.point for p in recs) == ["dev:queue", "dev:receive"]
        assert len({len(p.data) for p in recs}) == 1
    out = tmp_path / "t.pcapng"
    f = start_fcap(["-i", "dev:queue", "-i", "dev:receive", "--track", "-w", str(out), "-c", "2", expr])
    try:
        send_udp("127.0.0.1", sink.port, [b"t" * 5])
        assert f.wait() == 0, f.stderr
    finally:
        f.kill()
    back = list(fcap.read(out))
    assert sorted(p.point for p in back) == ["dev:queue", "dev:receive"] and len({p.packet_id for p in back}) == 1


def test_records_by_field_name():
    """fcap.Packet takes its metadata by name: each is a Record field and an attribute fcap's comment shows."""
    from fcap.api import Packet
    from fcap.features.metadata import METADATA as _METADATA
    from fcap.kernel.layout import COMMENT, Record
    assert set(_METADATA) == {"skb", "pid", "tid", "comm", "ifindex", "netns", "mark", "priority"}
    assert _METADATA == tuple(attr for _p, attr, _s in COMMENT if attr in _METADATA)   # (the comment's order)
    assert set(_METADATA) <= set(Record._fields) & {attr for _p, attr, _s in COMMENT}
    assert all(hasattr(Packet(ts_ns=0, point=None, data=b"", orig_len=0, linktype=1), n) for n in _METADATA)


COMM_PIECES = ("a", "b c", " ", "pid=3", " pid=3", " ifindex=9", "x=1", "=", " len=", "Web Content", "")


@pytest.mark.parametrize("tail", ["", " reason=NO_SOCKET at=f+0x1", "  cgroup=1", " stack=f+0x1<g+0x2", "x"])
def test_comment_metadata_in_one_match_reads_as_key_by_key(monkeypatch, tail):
    """Pure: the metadata section read in one match (fcap.features.comments._metadata) gives what the key-by-key
    reading gives, whatever comm holds (spaces, a known key, nothing), a value that is not a number, keys after it."""
    import itertools

    from fcap.features import comments
    texts = []
    for comm, pid in itertools.product(itertools.permutations(COMM_PIECES, 2), ("1", "z", "")):
        texts.append(f"skb=0xffff888100000001 pid={pid} tid=2 comm={''.join(comm)} ifindex=1 mark=0x1f priority=0 "
                     f"netns=4026531833 proto=0x0800 pkt_type=4 len=74{tail}")
    fast = [comments.parse(t) for t in texts]
    assert comments._metadata(texts[0].removesuffix(tail)) is not None   # (a plain comment: the one match is used)
    monkeypatch.setattr(comments, "_metadata", lambda line: None)
    assert fast == [comments.parse(t) for t in texts]


def test_every_key_of_the_comment_reads_back():
    """Pure: a comment with every key the schema declares (fcap.features.comments), written as each style writes it
    (text with spaces, a BPF program's verdict, a stack) reads back as the values, through the API's parse_comment; a
    line that is not fcap's comment reads as nothing."""
    from fcap.api import parse_comment
    from fcap.features.comments import KEYS, key_name, parse
    made = {"dec": 7, "dec64": 1 << 60, "hex": 0x1f, "hex4": 0x86dd, "hex16": 0xffff888100000001, "str": "a b"}
    shown = {"dec": "7", "dec64": str(1 << 60), "hex": "1f", "hex4": "86dd", "hex16": "ffff888100000001",
             "str": "a b"}
    text = "".join(pre + (shown[style] if attr != "stack" else "f+0x1<g+0x2") for pre, attr, style in KEYS)
    want = {attr: made[style] for _pre, attr, style in KEYS} | {"stack": ("f+0x1", "g+0x2")}
    assert parse_comment(text) == want and parse(text) == want
    assert parse(text.replace(" len=7", " len=7 newer=1 2 3")) == want   # (a key this version does not know)
    verdict = "skb=0x" + "0" * 16 + " pid=1 tid=1 comm=x ifindex=1 mark=0x0 netns=1 proto=0x0800 pkt_type=0 len=1"
    assert parse(verdict + " verdict=XDP_DROP stack=?")["verdict_name"] == "XDP_DROP"
    assert parse(verdict + " stack=?")["stack"] == () and parse("dump skb->dev = 1") == {}
    assert {key_name(pre) for pre, _a, _s in KEYS} >= {"skb", "at", "reason", "verdict", "stack"}
