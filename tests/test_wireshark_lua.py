"""fcap's metadata as Wireshark fields (fcap.commands.wireshark): the Lua dissector `fcap extcap --install` puts into
the personal Lua plugins folder of a HOME made for the test, read by the real tshark. Its fields are checked against
fcap's own reading of the same file (`fcap -r FILE --json`) packet by packet, its display filters select exactly
the packets fcap says have the value (and nothing for a value none has), and a --dump capture gives fcap.dump.*."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading

import pytest

from netns import SLOW, run_fcap, send_udp, start_fcap, subprocess_env

N = 3   # datagrams sent to a closed port: each is queued on lo, then dropped (NO_SOCKET)


@pytest.fixture
def home(tmp_path, tshark):
    """A HOME of the test's own with fcap's extcap and dissector installed; uninstalled (and checked) after."""
    env = subprocess_env()
    env["HOME"] = str(tmp_path / "home")
    env.pop("XDG_CONFIG_HOME", None)
    r = run_fcap(["extcap", "--install"], env=env)
    out = r.stdout.decode()
    plugin = tmp_path / "home/.local/lib/wireshark/plugins/fcap.lua"
    assert r.returncode == 0 and plugin.exists() and out.count("\n") == 1 and str(plugin) in out, r.stderr
    yield env
    r = run_fcap(["extcap", "--uninstall"], env=env)
    assert r.returncode == 0 and str(plugin) in r.stdout.decode() and not plugin.exists()


def _tshark(tshark: str, env: dict, *args: str) -> list[str]:
    r = subprocess.run([tshark, *args], capture_output=True, text=True, env=env, timeout=120 * SLOW)
    assert r.returncode == 0 and "rror" not in r.stderr, r.stderr
    return r.stdout.splitlines()


def _rows(tshark: str, env: dict, path, *fields: str, where: str = "") -> list[list[str]]:
    args = ["-r", str(path), "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=|"]
    if where:
        args += ["-Y", where]
    for f in fields:
        args += ["-e", f]
    return [line.split("\t") for line in _tshark(tshark, env, *args)]


def _numbers(tshark: str, env: dict, path, where: str) -> list[int]:
    """The frame numbers (from 1) a display filter selects."""
    return [int(r[0]) for r in _rows(tshark, env, path, "frame.number", where=where)]


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def capture(root, tmp_path) -> tuple:
    """A live capture on the host: N datagrams to a closed port on 127.0.0.1 at tp_btf/net_dev_queue and
    skb:drop, with --dump skb->dev and skb->len: (the file, fcap -r FILE --json's objects, the sender's tid)."""
    path = tmp_path / "drop.pcapng"
    port = _closed_port()
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "-i", "skb:drop", "--dump", "skb->dev", "--dump", "skb->len",
                     "-c", str(2 * N), "-w", str(path), f"udp and dst port {port}"])
    try:
        send_udp("127.0.0.1", port, [b"w" * (10 + i) for i in range(N)])
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
    r = run_fcap(["-r", str(path), "--json"])
    assert r.returncode == 0 and not r.stderr, r.stderr
    objs = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert len(objs) == 2 * N
    return path, objs, threading.get_native_id()


def test_field_table_is_the_comments_declaration():
    """Every key the comment declares (fcap.features.comments: layout.COMMENT, made from fcap.kernel.record, and the
    COMMENT of packet_context, drop_reason, nft_rule, prog_verdict and kernel_stack) has its field, named as fcap
    reads it."""
    from fcap.commands.wireshark import comment_fields, dissector_text, field_names
    from fcap.features.comments import SECTIONS
    from fcap.features.packet_context import COMMENT as CONTEXT_COMMENT
    from fcap.features.drop_reason import COMMENT as DROP_COMMENT
    from fcap.features.kernel_stack import COMMENT as STACK_COMMENT
    from fcap.kernel.layout import COMMENT
    from fcap.features.nft_rule import COMMENT as NFT_COMMENT
    from fcap.features.prog_verdict import COMMENT as VERDICT_COMMENT
    assert SECTIONS == (COMMENT, CONTEXT_COMMENT, DROP_COMMENT, NFT_COMMENT, VERDICT_COMMENT, STACK_COMMENT)
    assert [f for _k, f, _s in comment_fields()] == [attr for section in SECTIONS for _p, attr, _s in section]
    assert ("at", "location", "str") in comment_fields() and ("skb", "skb", "hex16") in comment_fields()
    text = dissector_text()
    for key, name, style in comment_fields():
        assert f'{{"{key}", "{name}", "{style}"}},' in text
    assert {"fcap.point", "fcap.pid", "fcap.comm", "fcap.reason", "fcap.location", "fcap.dump.member",
            "fcap.verdict_name", "fcap.stack"} <= set(field_names())


def test_tshark_registers_every_field(home, tshark):
    """tshark -G fields in the test's HOME lists each field with its type: integers as integers, skb as hex."""
    from fcap.commands.wireshark import field_names
    rows = {r[2]: r for r in (line.split("\t") for line in _tshark(tshark, home, "-G", "fields")) if len(r) > 4}
    assert set(field_names()) <= set(rows), set(field_names()) - set(rows)
    assert rows["fcap.pid"][3] == "FT_UINT32" and rows["fcap.comm"][3] == "FT_STRING"
    assert rows["fcap.skb"][3] == "FT_UINT64" and rows["fcap.skb"][5] == "BASE_HEX"


def test_comment_parsing_without_a_capture(home, tshark, tmp_path):
    """A file written by fcap's writer with a comm holding spaces and a key the dissector does not know: the comm
    whole, the unknown key as fcap.other, the numbers typed; fcap's own reader (fcap.features.comments.parse, the API's
    and `fcap path`'s) reads it by the same rule."""
    from fcap.files.linktypes import lookup
    from fcap.files.pcapfile import PcapngWriter
    from fcap.features.comments import parse
    path = tmp_path / "made.pcapng"
    comment = ("skb=0xffff888100000001 pid=7 tid=8 comm=Web Content ifindex=3 mark=0x1f netns=4026531840 "
               "proto=0x0800 pkt_type=0 len=20 newkey=5 reason=NO_SOCKET at=f+0x1")
    assert parse(comment) == dict(skb=0xffff888100000001, pid=7, tid=8, comm="Web Content", ifindex=3, mark=0x1f,
                                  netns=4026531840, protocol=0x800, pkt_type=0, len=20, reason="NO_SOCKET",
                                  location="f+0x1")
    with open(path, "wb") as f:
        w = PcapngWriter(f, closefd=False)
        iface = w.add_interface("skb:drop", lookup("LINUX_SLL2").number, description="tp_btf/kfree_skb")
        w.write(1, bytes(20), 20, iface, comment=comment)
    rows = _rows(tshark, home, path, "fcap.point", "fcap.skb", "fcap.pid", "fcap.tid", "fcap.comm", "fcap.ifindex",
                 "fcap.mark", "fcap.netns", "fcap.other", "fcap.reason", "fcap.location")
    assert rows == [["skb:drop", "0xffff888100000001", "7", "8", "Web Content", "3", "0x0000001f", "4026531840",
                     "newkey=5", "NO_SOCKET", "f+0x1"]]
    assert _numbers(tshark, home, path, 'fcap.comm == "Web Content" && fcap.mark == 31') == [1]
    assert _numbers(tshark, home, path, 'fcap.comm == "Web"') == []


def test_context_keys_give_fields(home, tshark, tmp_path):
    """A --context comment (a cgroup path with a space, a container, a pod, a netns name): each key its fcap.* field,
    as fcap.read() reads the same comment back."""
    import fcap
    from fcap.files.linktypes import lookup
    from fcap.files.pcapfile import PcapngWriter
    path = tmp_path / "ctx.pcapng"
    cid = "ab" * 32
    comment = ("skb=0xffff888100000001 pid=7 tid=8 comm=curl ifindex=3 mark=0x0 netns=4026531840 proto=0x0800 "
               f"pkt_type=0 len=20 cgroup=4294967342 cgroup_path=/kubepods.slice/my pod/cri-containerd-{cid}.scope "
               f"container=containerd:{cid} pod=0f2c3b1e-aaaa-bbbb-cccc-0123456789ab netns_name=red")
    with open(path, "wb") as f:
        w = PcapngWriter(f, closefd=False)
        iface = w.add_interface("tp_btf/net_dev_queue", lookup("LINUX_SLL2").number)
        w.write(1, bytes(20), 20, iface, comment=comment)
    rows = _rows(tshark, home, path, "fcap.cgroup", "fcap.cgroup_path", "fcap.container", "fcap.pod",
                 "fcap.netns_name", "fcap.len")
    (p,) = list(fcap.read(str(path)))
    assert rows == [[str(p.cgroup), p.cgroup_path, p.container, p.pod, p.netns_name, "20"]]
    assert p.cgroup == 4294967342 and p.cgroup_path == f"/kubepods.slice/my pod/cri-containerd-{cid}.scope"
    assert _numbers(tshark, home, path, f'fcap.container == "containerd:{cid}" && fcap.cgroup == 4294967342') == [1]


def test_fields_are_fcaps_reading_packet_by_packet(home, tshark, capture):
    """tshark -T fields -e fcap.* over a live capture: fcap -r --json's values, packet by packet; the sender's own
    task at net_dev_queue."""
    path, objs, tid = capture
    rows = _rows(tshark, home, path, "fcap.point", "fcap.skb", "fcap.pid", "fcap.tid", "fcap.comm", "fcap.ifindex",
                 "fcap.netns", "fcap.mark", "fcap.reason", "fcap.location")
    assert len(rows) == len(objs)
    for o, row in zip(objs, rows):
        want = [o["point"], f"0x{int(o['skb'], 16):016x}", str(o["pid"]), str(o["tid"]), o["comm"],
                str(o["ifindex"]), str(o["netns"]), f"0x{o['mark']:08x}", o.get("reason", ""), o.get("location", "")]
        assert row == want, (o, row)
    queued = [o for o in objs if o["point"] == "tp_btf/net_dev_queue"]
    assert len(queued) == N and all(o["pid"] == os.getpid() and o["tid"] == tid for o in queued)
    with open("/proc/self/comm") as f:
        assert {o["comm"] for o in queued} == {f.read().strip()}


def test_filters_select_what_fcap_says(home, tshark, capture):
    """-Y on fcap.reason, fcap.comm, fcap.pid, fcap.point: exactly the packets whose --json has the value; a value
    no packet has selects nothing."""
    path, objs, _tid = capture
    drops = [i + 1 for i, o in enumerate(objs) if o.get("reason") == "NO_SOCKET"]
    assert len(drops) == N
    assert _numbers(tshark, home, path, 'fcap.reason == "NO_SOCKET"') == drops
    assert _numbers(tshark, home, path, 'fcap.point == "skb:drop"') == drops
    assert _numbers(tshark, home, path, 'fcap.location contains "+0x"') == drops
    assert _numbers(tshark, home, path, 'fcap.reason == "NOT_SPECIFIED"') == []
    comm, pid = objs[0]["comm"], objs[0]["pid"]
    assert _numbers(tshark, home, path, f'fcap.comm == "{comm}"') == \
        [i + 1 for i, o in enumerate(objs) if o["comm"] == comm]
    assert _numbers(tshark, home, path, f"fcap.pid == {pid}") == [i + 1 for i, o in enumerate(objs) if o["pid"] == pid]
    assert _numbers(tshark, home, path, f"fcap.pid == {max(o['pid'] for o in objs) + 1}") == []
    assert _numbers(tshark, home, path, f'fcap.comm == "{comm}x"') == []
    # pcapng's own options stay where they are: the verdict at the drop point, the direction at the queue
    assert _numbers(tshark, home, path, "frame.verdict.ebpf_tc == 2") == drops


def test_dumps_give_fields(home, tshark, capture):
    """--dump skb->dev and skb->len: fcap.dump.path, .type, .addr, and a member per leaf (PATH.MEMBER=VALUE) with
    the values fcap -r --json reads."""
    path, objs, _tid = capture
    rows = _rows(tshark, home, path, "fcap.dump.path", "fcap.dump.type", "fcap.dump.member")
    assert len(rows) == len(objs)
    for o, (paths, types, members) in zip(objs, rows):
        dev, length = o["dumps"]["skb->dev"], o["dumps"]["skb->len"]
        assert paths == "skb->dev|skb->len" and types == "struct net_device|unsigned int"
        members = members.split("|")
        assert f"skb->len={length}" in members and "skb->dev.name=lo" in members
        assert f"skb->dev.mtu={dev['mtu']}" in members and f"skb->dev.ifindex={dev['ifindex']}" in members
    length = objs[-1]["dumps"]["skb->len"]
    assert _numbers(tshark, home, path, f'fcap.dump.member == "skb->len={length}"') == \
        [i + 1 for i, o in enumerate(objs) if o["dumps"]["skb->len"] == length]
    assert _numbers(tshark, home, path, 'fcap.dump.member == "skb->dev.name=eth99"') == []
