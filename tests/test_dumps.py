"""--dump PATH on live traffic: what the kernel held, checked against what user space knows (lo's and a veth's
name, MTU and ifindex in struct net_device; a UDP socket's addresses and ports in struct sock_common), carried in
pcapng (read back by fcap's reader, `fcap -r`, tshark), printed under each packet on a terminal; bad paths in one
line. fentry arguments and fexit `return` where the kernel allows trampolines (tests/vm guests)."""

from __future__ import annotations

import os
import pty
import socket
import subprocess
import threading
import time

import pytest
from conftest import need_root, require_kind

from netns import fcap_argv, pcapng_plan, run_fcap, send_udp, send_while_given, sh, start_fcap, subprocess_env

POINT = "tp_btf/net_dev_queue"


def _mtu(dev: str, ns: str | None = None) -> int:
    if ns is None:
        with open(f"/sys/class/net/{dev}/mtu") as f:
            return int(f.read())
    return int(sh("ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/mtu").stdout)


def _send_later(dst: str, port: int, n: int, delay: float = 0.3) -> threading.Thread:
    """Datagrams sent from a thread once the capture is attached (fcap.capture returns attached)."""
    def run():
        time.sleep(delay)
        send_udp(dst, port, [b"fcap-dump %d" % i for i in range(n)], pace=0.02)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _connected(port: int) -> socket.socket:
    """A UDP socket connected to 127.0.0.1:port (a connected socket holds the peer's address and port)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.connect(("127.0.0.1", port))
    return s


def _send_connected_later(s: socket.socket, n: int, delay: float = 0.3) -> threading.Thread:
    def run():
        time.sleep(delay)
        for i in range(n):
            s.send(b"fcap-dump %d" % i)
            time.sleep(0.02)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---- known values ------------------------------------------------------------------------------------------

def test_lo_device_and_socket_ports(sink):
    import fcap
    paths = ["skb->dev", "skb->len", "skb->sk->__sk_common", "skb", "skb->dev->name"]
    with _connected(sink.port) as s, fcap.capture(POINT, filter=f"udp and dst port {sink.port}", count=3,
                                                  dump=paths, timeout=30) as cap:
        sport = s.getsockname()[1]
        t = _send_connected_later(s, 3)
        pkts = list(cap)
        t.join()
    assert len(pkts) == 3
    for p in pkts:
        dev = p.dumps["skb->dev"]
        assert dev.error is None and dev.ctype == "struct net_device" and dev.addr
        v = dev.value
        assert (v["name"], v["mtu"], v["ifindex"]) == ("lo", _mtu("lo"), socket.if_nametoindex("lo"))
        assert p.ifindex == v["ifindex"]
        assert p.dumps["skb->len"].value == p.orig_len == len(p.data)     # at the device: the whole frame
        assert p.dumps["skb->dev->name"].value == "lo" and p.dumps["skb->dev->name"].ctype == "char[16]"
        sk = p.dumps["skb->sk->__sk_common"].value
        assert sk["skc_family"] == socket.AF_INET
        assert (sk["skc_num"], sk["skc_dport"]) == (sport, sink.port)        # __be16 shown in host order
        assert sk["skc_rcv_saddr"] == sk["skc_daddr"] == 0x7F000001
        skb = p.dumps["skb"]
        assert skb.ctype == "struct sk_buff" and skb.addr == p.skb and skb.value["len"] == p.orig_len
        assert skb.value["dev"] == dev.addr
        text = dev.text()
        assert text.startswith("(struct net_device){\n\t") and '\t.name = (char[16])"lo",\n' in text
        assert f"\t.mtu = (unsigned int){_mtu('lo')},\n" in text
        compact = p.dumps["skb->sk->__sk_common"].text(compact=True)
        assert "\n" not in compact and f".skc_dport = (__be16){sink.port}," in compact


def test_veth_device(veth_ns):
    import fcap
    v = veth_ns
    sh("ip", "link", "set", v.a, "mtu", "1400")
    port = 9
    with fcap.capture(POINT, filter=f"udp and dst host {v.peer} and dst port {port}", count=2,
                      dump=["skb->dev"], timeout=30) as cap:
        t = _send_later(v.peer, port, 2)
        pkts = list(cap)
    t.join()
    assert len(pkts) == 2
    for p in pkts:
        d = p.dumps["skb->dev"].value
        assert (d["name"], d["mtu"], d["ifindex"]) == (v.a, 1400, v.a_index) == (v.a, _mtu(v.a), p.ifindex)


def test_null_pointer_on_the_way_and_bitfield_leaf(sink):
    """lo's receive side: the skb has no socket (loopback_xmit orphans it): the dump says where the chain
    stopped; pkt_type is a bitfield (PACKET_HOST)."""
    import fcap
    with fcap.capture("tp_btf/netif_receive_skb", filter=f"udp and dst port {sink.port}", count=1, timeout=30,
                      dump=["skb->sk->__sk_common", "skb->pkt_type", "skb->dev->name"]) as cap:
        t = _send_later("127.0.0.1", sink.port, 1)
        (p,) = list(cap)
    t.join()
    sk = p.dumps["skb->sk->__sk_common"]
    assert sk.error == "NULL pointer at skb->sk" and sk.value is None and sk.text() == "<NULL pointer at skb->sk>"
    assert p.dumps["skb->pkt_type"].value == 0 and p.dumps["skb->pkt_type"].text() == "(__u8)0"
    assert p.dumps["skb->dev->name"].value == "lo"


def test_untyped_point_raw_tp(sink):
    import fcap
    with fcap.capture("raw_tp/net_dev_queue", filter=f"udp and dst port {sink.port}", count=1, timeout=30,
                      dump=["skb->dev", "skb->len"]) as cap:
        t = _send_later("127.0.0.1", sink.port, 1)
        (p,) = list(cap)
    t.join()
    assert p.dumps["skb->dev"].value["name"] == "lo" and p.dumps["skb->len"].value == p.orig_len


# ---- in files, on the terminal -------------------------------------------------------------------------------

def test_pcapng_carries_dumps_to_reader_fcap_r_and_tshark(sink, tmp_path, tshark):
    import fcap
    out = tmp_path / "d.pcapng"
    f = start_fcap(["-i", POINT, "-w", str(out), "-c", "2", "--dump", "skb->dev", "--dump", "skb->len",
                    "--dump", "skb->sk->__sk_common", f"udp and dst port {sink.port}"])
    try:
        with _connected(sink.port) as s:
            s.send(b"x" * 10)
            s.send(b"y" * 20)
        assert f.wait() == 0, f.stderr
    finally:
        f.kill()
    pkts = list(fcap.read(out))
    assert len(pkts) == 2
    for p in pkts:
        assert p.point == POINT and p.comm and p.pid and p.skb
        assert p.dumps["skb->dev"].value["name"] == "lo" and p.dumps["skb->dev"].value["mtu"] == _mtu("lo")
        assert p.dumps["skb->len"].value == p.orig_len
        assert p.dumps["skb->sk->__sk_common"].value["skc_dport"] == sink.port
    r = run_fcap(["-r", str(out), "--dump-style", "compact"])
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 0 and len(lines) == 8, r.stdout + r.stderr
    assert lines[1].startswith("  skb->dev @0x") and '.name = (char[16])"lo",' in lines[1]
    assert lines[2] == f"  skb->len @0x{pkts[0].dumps['skb->len'].addr:x} = (unsigned int){pkts[0].orig_len}"
    multi = run_fcap(["-r", str(out)]).stdout.decode()
    assert '\n  \t.name = (char[16])"lo",\n' in multi
    t = subprocess.run([tshark, "-r", str(out), "-T", "fields", "-e", "frame.comment"], capture_output=True,
                       text=True, timeout=60)
    assert t.returncode == 0, t.stderr
    rows = t.stdout.splitlines()
    assert len(rows) == 2 and all("dump skb->dev @0x" in row and '.name = (char[16])"lo"' in row for row in rows)


def test_each_block_of_a_flood_has_its_own_records_dumps(sink, tmp_path):
    """Into a file the drain caches each block's options by the record's metadata and dump area together
    (fcap.live.drain.FileDrain's lead), and where the programs write the file rings they look the options up by a
    hash of the dumps (fcap.kernel.dumps.GivenOptions): thousands of datagrams from four sockets, of sizes that
    vary, on recycled skbs, each block's dumps those of its own packet: skb->len its length and read from its own
    skb (the comment's skb= address), the socket's port its UDP source port."""
    import struct

    from bpf.btf import BTF

    import fcap
    out = tmp_path / "flood.pcapng"
    n = 3000
    f = start_fcap(["-i", POINT, "-w", str(out), "-c", str(n), "--dump", "skb->len", "--dump",
                    "skb->sk->__sk_common", f"udp and dst port {sink.port}"])
    socks = [_connected(sink.port) for _ in range(4)]
    ports = {s.getsockname()[1] for s in socks}
    try:
        for i in range(n):
            socks[i % 4].send(b"d" * (1 + i * 7 % 61))
        assert f.wait() == 0, f.stderr
    finally:
        f.kill()
        for s in socks:
            s.close()
    pkts = list(fcap.read(out))
    assert len(pkts) == n
    seen = set()
    len_at = BTF.vmlinux().find("sk_buff", "struct").member("len")[1] // 8
    for p in pkts:
        sport = struct.unpack_from("!H", p.data, 14 + 20)[0]
        assert p.dumps["skb->len"].value == p.orig_len and p.dumps["skb->len"].addr == p.skb + len_at
        assert p.dumps["skb->sk->__sk_common"].value["skc_num"] == sport and sport in ports
        seen.add((p.orig_len, sport))
    assert len(seen) > 200 and len({p.skb for p in pkts}) < n   # (sizes and ports mixed; skbs recycled)


def test_printed_under_each_packet_on_a_terminal(sink):
    need_root()
    master, slave = pty.openpty()
    p = subprocess.Popen(fcap_argv() + ["-i", POINT, "-c", "1", "--dump", "skb->dev->name", "--dump", "skb->dev",
                                        "--dump-style", "compact", f"udp and dst port {sink.port}"],
                         stdout=slave, stderr=subprocess.PIPE, env=subprocess_env())
    os.close(slave)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and p.poll() is None:
            send_udp("127.0.0.1", sink.port, [b"tty"])
            time.sleep(0.3)
        p.wait(timeout=30)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert p.returncode == 0 and len(lines) == 3, lines
    assert " IP 127.0.0.1." in lines[0] and "UDP, length 3" in lines[0]
    assert lines[1].startswith("  skb->dev->name @0x") and lines[1].endswith(' = (char[16])"lo"')
    assert lines[2].startswith("  skb->dev @0x") and ".mtu = (unsigned int)" in lines[2]


# ---- bad paths: one line ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--dump", "skb->devv"], "--dump skb->devv: struct sk_buff has no member 'devv' (members: next, prev, dev, "),
    (["--dump", "skb->dev->nme"], "--dump skb->dev->nme: struct net_device has no member 'nme' (members: "),
    (["--dump", "return"], "--dump return: 'return' exists only at fexit points"),
    (["--dump", "sock"], "--dump sock: no argument 'sock' at tp_btf/net_dev_queue (arguments: skb)"),
    (["--dump", "skb->len->x"], "--dump skb->len->x: skb->len is not a pointer (unsigned int)"),
    (["--dump", "skb.len"], "--dump skb.len: skb is a pointer: use -> before len"),
    (["--dump", "skb->"], "--dump 'skb->': expected an argument or a member chain"),
    (["--dump", "skb", "-w", "/dev/null", "--format", "pcap"], "--dump: a pcap file has no room for the dumps"),
])
def test_bad_paths_one_line(args, says):
    need_root()
    r = run_fcap(["-i", POINT, *args])
    err = r.stderr.decode()
    assert r.returncode != 0 and err.startswith("fcap: " + says) and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_member_list_names_members_of_anonymous_unions():
    from bpf.btf import BTF
    from fcap.points.members import member_names
    names = member_names(BTF.vmlinux().find("sk_buff", "struct"))
    assert {"dev", "len", "protocol", "pkt_type", "mark"} <= set(names) and "" not in names


# ---- fentry arguments and fexit return (kernels that allow trampolines: tests/vm guests) ----------------------

def test_fentry_arguments(sink):
    require_kind("fentry", "ip_send_skb")
    import fcap
    # (a predicate, not a filter: at ip_send_skb skb->protocol is not set yet, so the LINUX_SLL2 header has 0)
    where = [f"skb->sk->__sk_common.skc_dport == {sink.port}"]
    with _connected(sink.port) as s, fcap.capture("fentry/ip_send_skb", where=where, count=1, timeout=60 * 6,
                                                  dump=["skb->sk", "net"]) as cap:
        t = _send_connected_later(s, 1)
        (p,) = list(cap)
        t.join()
    sk = p.dumps["skb->sk"]
    assert sk.ctype == "struct sock" and sk.value["__sk_common"]["skc_dport"] == sink.port
    net = p.dumps["net"]
    assert net.ctype == "struct net" and net.value["ns"]["inum"] == os.stat("/proc/self/ns/net").st_ino


def test_fexit_return(sink):
    """__ip_local_out returns 1 when netfilter lets the packet on (ip_local_out then sends it): at its exit the
    skb is still the caller's (not so at ip_send_skb's, where lo has already freed it)."""
    require_kind("fexit", "__ip_local_out")
    import fcap
    where = [f"skb->sk->__sk_common.skc_dport == {sink.port}"]
    with _connected(sink.port) as s, fcap.capture("fexit/__ip_local_out", where=where, count=1, timeout=60 * 6,
                                                  dump=["return", "skb->len", "sk"]) as cap:
        t = _send_connected_later(s, 1)
        (p,) = list(cap)
        t.join()
    ret = p.dumps["return"]
    assert ret.ctype == "int" and ret.value == 1 and ret.addr == 0 and ret.text() == "(int)1"
    assert p.dumps["skb->len"].value == 28 + len(b"fcap-dump 0")
    assert p.dumps["sk"].value["__sk_common"]["skc_dport"] == sink.port


# ---- into the file rings --------------------------------------------------------------------------------------

DEV = ("skb->dev->name", "skb->dev->mtu")


def test_whole_structures_leave_the_rings_to_the_perf_buffer():
    """The options of a dump of struct nf_conn or struct net_device may run to several KiB, more than the programs
    copy: such a capture takes the perf buffer's path (as --perf-buffer), members of them the rings."""
    if not pcapng_plan([POINT], dump=DEV).dump_texts:
        pytest.skip("the records go through the perf buffer on this kernel (no file rings)")
    assert not pcapng_plan([POINT], dump=("skb->dev",)).ring_size
    assert not pcapng_plan([POINT], dump=("skb->dev", "skb->len")).dump_texts

@pytest.mark.parametrize("extra", [[], ["--no-skb-dynptr"]], ids=["rings", "rings and frags by perf"])
def test_the_programs_write_the_dumps_options_user_space_gave_them(sink, tmp_path, extra):
    """--dump into pcapng where the programs write the file rings: the first packet goes through the perf buffer,
    user space gives the programs its dumps' options (a comment and a custom option each, as the writer lays them
    out) under their hash (the map fcap_dumptext, read with bpftool), and the programs write them into the records
    with the same dumps after it themselves: the programs' count of records through the perf buffer is one per
    distinct dumps given (lo's name and MTU: one), and every record read back holds lo's."""
    if not pcapng_plan([POINT], dump=DEV).dump_texts:
        pytest.skip("the records go through the perf buffer on this kernel (no file rings): the dumps' options are "
                    "user space's, as the tests above check")
    import fcap
    from fcap.kernel.layout import DUMP_TEXT
    path = tmp_path / "dev.pcapng"
    fc = start_fcap(["-i", POINT, "--dump", DEV[0], "--dump", DEV[1], "-c", "42", "-w", str(path), *extra,
                     f"udp dst port {sink.port}"])
    try:
        first, counted, texts = send_while_given(fc, sink.port, "fcap_dumptext", DUMP_TEXT, raw=True)
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
    pkts = list(fcap.read(str(path)))
    assert len(pkts) == 42
    mtu = _mtu("lo")
    assert all(p.dumps[DEV[0]].data.rstrip(b"\0") == b"lo" and p.dumps[DEV[0]].text() == '(char[16])"lo"' and
               p.dumps[DEV[1]].value == mtu for p in pkts)
    assert texts and all(t[4:].startswith(b"dump skb->dev->name @0x") for t in texts.values()), texts
    assert first == 1, f"{first} records went through the perf buffer before the options were given (the first's)"
    assert counted <= len(texts) + 1 < 10, \
        f"{counted} records through the perf buffer, {len(texts)} distinct dumps given (each one's first: the " \
        "programs write the rest)"
