"""fcap at the entry and exit of XDP and tc programs (-i xdp/PROG, tc/PROG): the tests' own programs (tests/bpfprogs:
a TTL rewrite with its checksum fixed, a drop counted in a map) on a veth pair into a namespace. What fcap wrote,
read back (fcap's reader, tcpdump, tshark where installed), against the datagrams sent, the rewrite, the program's
drop count and what the receiver got. fentry/fexit on programs: guests only (the host refuses them: there the
one-line refusal is checked)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys

import pytest

from netns import run_fcap, start_fcap

from bpf import probes
from bpf.errors import BPFError
from bpf.link import attach_device
from bpf.uapi import AttachType, ProgType

N_REWRITE, N_DROP = 6, 4
TTL = 64
IP_RECVTTL = 12

SEND = r"""
import socket, sys, time
dst, rp, dp, nr, nd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 64)
for i in range(max(nr, nd)):
    if i < nr: s.sendto(b"rewrite %d" % i, (dst, rp))
    if i < nd: s.sendto(b"drop %d" % i, (dst, dp))
    time.sleep(0.02)
"""


def _program(prog_type):
    from bpfprogs import TestProgram
    ports = []
    for _ in range(2):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    word = "x" if prog_type == ProgType.XDP else "t"
    name = f"fcap_{word}{os.getpid() % 100000}"
    return TestProgram(prog_type, name, ports[0], ports[1]), ports[0], ports[1]


def _refusal(prog) -> str | None:
    """Why this kernel will not attach fentry to a BPF program (the probe fcap's kinds run), or None."""
    from bpf.objects import prog_desc
    func = prog_desc(prog.fileno()).funcs[0][1]
    r = probes.tracing_program(AttachType.TRACE_FENTRY, func, prog.fileno(), label="fentry on a BPF program")
    return None if r is None else r.reason


@pytest.fixture
def xdp_prog(root):
    prog, rewrite, drop = _program(ProgType.XDP)
    try:
        yield prog, rewrite, drop
    finally:
        prog.close()


@pytest.fixture
def tc_prog(root):
    prog, rewrite, drop = _program(ProgType.SCHED_CLS)
    try:
        yield prog, rewrite, drop
    finally:
        prog.close()


def _receiver(addr: str, port: int) -> socket.socket:
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
    r.bind((addr, port))
    r.settimeout(2.0)
    return r


def _received_ttls(r: socket.socket, n: int) -> list[int]:
    out = []
    try:
        while len(out) < n:
            _data, anc, _f, _a = r.recvmsg(2048, socket.CMSG_SPACE(4))
            out += [int.from_bytes(d[:4], sys.byteorder) for _lvl, t, d in anc if t == socket.IP_TTL]
    except socket.timeout:
        pass
    return out


def _send(v, rewrite: int, drop: int) -> None:
    subprocess.run(v.exec(sys.executable, "-c", SEND, v.local, str(rewrite), str(drop), str(N_REWRITE),
                          str(N_DROP)), check=True, timeout=120)


def _ip_checksum_ok(ip: bytes) -> bool:
    s = sum(struct.unpack("!10H", ip[:20]))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s == 0xFFFF


def _udp(rec, linktype_off: int = 14):
    """(ttl, dst port, ip header bytes) of an Ethernet record carrying IPv4 UDP."""
    ip = bytes(rec.data[linktype_off:])
    return ip[8], int.from_bytes(ip[22:24], "big"), ip[:20]


def _capture(tmp_path, spec: str, v, rewrite: int, drop: int, *extra: str):
    """Run fcap at `spec` while the namespace sends the datagrams; the records by interface, and the receiver's
    TTLs."""
    from fcap.files.pcapread import read
    out = tmp_path / "out.pcapng"
    recv = _receiver(v.local, rewrite)
    fcap = start_fcap(["-i", spec, "-w", str(out), *extra])
    try:
        _send(v, rewrite, drop)
        ttls = _received_ttls(recv, N_REWRITE)
    finally:
        assert fcap.stop() == 0, fcap.stderr
        recv.close()
    by_iface: dict[str, list] = {}
    for rec in read(out):
        by_iface.setdefault(rec.iface_name, []).append(rec)
    return out, by_iface, ttls


def _check(out, by_iface, ttls, prog, kind: str, rewrite: int, drop: int, vtype: int, ok: int, shot: int,
           name: str = "") -> None:
    name = name or prog.name
    entry, exit_ = by_iface.get(f"{kind}.entry/{name}", []), by_iface.get(f"{kind}.exit/{name}", [])
    want = sorted([rewrite] * N_REWRITE + [drop] * N_DROP)
    assert sorted(_udp(r)[1] for r in entry) == want, by_iface.keys()
    assert sorted(_udp(r)[1] for r in exit_) == want
    # entry: as sent; exit: the rewrite's TTL one less with a valid checksum, the drops untouched
    assert all(_udp(r)[0] == TTL and _ip_checksum_ok(_udp(r)[2]) for r in entry)
    for r in exit_:
        ttl, port, ip = _udp(r)
        assert _ip_checksum_ok(ip)
        assert (ttl, r.verdict) == ((TTL - 1, (vtype, ok)) if port == rewrite else (TTL, (vtype, shot))), r
    assert all(r.verdict is None for r in entry)
    shots = [r for r in exit_ if r.verdict == (vtype, shot)]
    assert len(shots) == N_DROP == prog.drops()          # the program's own count of what it dropped
    assert ttls == [TTL - 1] * N_REWRITE                 # what the receiver got: the rewritten datagrams only
    names = {1: "TC_ACT_SHOT", 2: "XDP_DROP"}
    assert all(f"verdict={names[vtype]}" in r.comment for r in shots)
    objs = [json.loads(line) for line in run_fcap(["-r", str(out), "--json"]).stdout.decode().splitlines()]
    assert [o.get("verdict") for o in objs].count(names[vtype]) == N_DROP
    if shutil.which("tcpdump"):
        lines = subprocess.run(["tcpdump", "-nn", "-r", str(out)], capture_output=True, text=True).stdout
        assert len(lines.splitlines()) == 2 * (N_REWRITE + N_DROP)
    if shutil.which("tshark"):
        field = "frame.verdict.ebpf_xdp" if vtype == 2 else "frame.verdict.ebpf_tc"
        got = subprocess.run(["tshark", "-r", str(out), "-T", "fields", "-e", field, f"udp.dstport == {drop}"],
                             capture_output=True, text=True).stdout.split()
        assert got.count(str(shot)) == N_DROP, got


def test_xdp_entry_and_exit_with_the_verdict(xdp_prog, veth_ns, tmp_path):
    prog, rewrite, drop = xdp_prog
    reason = _refusal(prog.prog)
    if reason is not None:
        pytest.skip(f"this kernel refuses fentry on BPF programs: {reason}")
    link = attach_device(prog.fileno(), veth_ns.a_index, AttachType.XDP, f"xdp on {veth_ns.a}")
    try:
        out, by_iface, ttls = _capture(tmp_path, f"xdp/{prog.name}", veth_ns, rewrite, drop,
                                       "--ifindex", str(veth_ns.a_index), "inbound and udp")
        _check(out, by_iface, ttls, prog, "xdp", rewrite, drop, 2, 2, 1)
        # printed: each line names its point, and the exit's its verdict
        printed = tmp_path / "printed.txt"
        with open(printed, "wb") as f:
            fcap = start_fcap(["-i", f"xdp/{prog.name}", "-l", "udp"], stdout=f)
            try:
                _send(veth_ns, rewrite, drop)
            finally:
                assert fcap.stop() == 0, fcap.stderr
    finally:
        link.close()
    lines = printed.read_text().splitlines()
    assert sum(f"xdp.exit/{prog.name} [verdict=XDP_DROP]" in line for line in lines) == N_DROP, lines
    assert sum(f"xdp.exit/{prog.name} [verdict=XDP_PASS]" in line for line in lines) == N_REWRITE, lines
    assert sum(f"xdp.entry/{prog.name}" in line for line in lines) == N_REWRITE + N_DROP, lines


def test_tc_entry_and_exit_with_the_verdict(tc_prog, veth_ns, tmp_path):
    prog, rewrite, drop = tc_prog
    reason = _refusal(prog.prog)
    if reason is not None:
        pytest.skip(f"this kernel refuses fentry on BPF programs: {reason}")
    link, where = None, f"{veth_ns.a} ingress (tcx)"
    try:
        link = attach_device(prog.fileno(), veth_ns.a_index, AttachType.TCX_INGRESS, f"tcx on {veth_ns.a}")
    except BPFError:   # before tcx (6.6): clsact through iproute2
        if not shutil.which("tc"):
            pytest.skip("no tcx links on this kernel, and no tc command for clsact")
        from bpfprogs import attach_clsact
        attach_clsact(prog, veth_ns.a)
        where = f"{veth_ns.a} ingress (clsact)"
    from bpfprogs import TestProgram
    twin = TestProgram(ProgType.SCHED_CLS, prog.name, rewrite, drop)   # (not attached: the points are by id)
    try:
        listed = run_fcap(["list-devices", f"tc/{prog.name}"]).stdout.decode()
        assert f"tc/{prog.name}  BPF program id {prog.id}, attached to {where}" in listed, listed
        out, by_iface, ttls = _capture(tmp_path, f"tc/{prog.id}", veth_ns, rewrite, drop, "udp")
    finally:
        twin.close()
        if link is not None:
            link.close()
    _check(out, by_iface, ttls, prog, "tc", rewrite, drop, 1, 0, 2, name=f"{prog.name}#{prog.id}")


def test_refused_on_this_kernel_in_one_line(xdp_prog):
    prog, _rewrite, _drop = xdp_prog
    reason = _refusal(prog.prog)
    if reason is None:
        pytest.skip("this kernel attaches fentry to BPF programs")
    r = run_fcap(["-i", f"xdp/{prog.name}", "-w", os.devnull])
    err = r.stderr.decode().strip()
    assert r.returncode != 0 and len(err.splitlines()) == 1, err
    assert "EPERM" in err and "tp_btf/netif_receive_skb" in err and "Traceback" not in err


def test_names_and_ids(xdp_prog, tc_prog):
    """A program by name or id; an ambiguous name lists the ids; list-devices lists the programs."""
    from bpfprogs import TestProgram
    prog, rewrite, drop = xdp_prog
    twin = TestProgram(ProgType.XDP, prog.name, rewrite, drop)
    try:
        r = run_fcap(["-i", f"xdp/{prog.name}", "-w", os.devnull])
        err = r.stderr.decode().strip()
        assert r.returncode != 0 and len(err.splitlines()) == 1, err
        assert f"2 XDP programs are called {prog.name!r}" in err and str(prog.id) in err and str(twin.id) in err
        r = run_fcap(["info", f"xdp/{prog.id}", f"xdp/{twin.id}"])   # by id: each its own name
        assert [line for line in r.stdout.decode().splitlines() if "points:" in line] == [
            f"  points: xdp.entry/{p.name}#{p.id}, xdp.exit/{p.name}#{p.id}" for p in (prog, twin)], r
    finally:
        twin.close()
    tc = tc_prog[0]
    r = run_fcap(["-i", f"xdp/{tc.id}", "-w", os.devnull])
    assert r.returncode != 0 and "is not an XDP program" in r.stderr.decode(), r.stderr
    r = run_fcap(["-i", "tc/fcap_no_such_prog", "-w", os.devnull])
    assert r.returncode != 0 and "no loaded tc program is called" in r.stderr.decode()
    r = run_fcap(["info", f"tc/{tc.id}"])
    assert r.stdout.decode().splitlines() == [f"int {tc.name}(struct sk_buff *skb);  [BPF program id {tc.id}]",
                                              f"  points: tc.entry/{tc.name}, tc.exit/{tc.name}"], r
    r = run_fcap(["list-devices", "fcap_*"])
    lines = r.stdout.decode().splitlines()
    assert f"xdp/{prog.name}  BPF program id {prog.id}, not attached to a device (that fcap sees)" in lines, lines
    assert any(line.startswith(f"tc/{tc.name}  BPF program id {tc.id}") for line in lines), lines


def test_a_program_without_btf_is_one_clear_line(root):
    """fentry finds a program's main function through its BTF function info: without it, one line saying so."""
    from bpf import asm
    from bpf.prog import load
    name = f"fcap_n{os.getpid() % 100000}"
    with load(ProgType.XDP, [asm.movi(asm.R0, 2), asm.exit_()], name=name):
        r = run_fcap(["-i", f"xdp/{name}", "-w", os.devnull])
    err = r.stderr.decode().strip()
    assert r.returncode != 0 and len(err.splitlines()) == 1 and "without BTF function info" in err, err


def test_list_devices_says_where_xdp_is_attached(xdp_prog, veth_ns):
    prog = xdp_prog[0]
    link = attach_device(prog.fileno(), veth_ns.a_index, AttachType.XDP, f"xdp on {veth_ns.a}")
    try:
        r = run_fcap(["list-devices", "--json", f"xdp/{prog.name}"])
    finally:
        link.close()
    import json
    rows = [row for row in json.loads(r.stdout) if row.get("id") == prog.id]
    assert rows and f"{veth_ns.a} (xdp link)" in rows[0]["attached"], rows


JUMBO = 8000   # a UDP payload past a page: the veth hands an xdp.frags program the frame in pieces


def test_xdp_multi_buffer_frames_are_whole(veth_ns, tmp_path, root):
    """A jumbo frame (MTU 9000 on the veth pair) into an xdp.frags program (BPF_F_XDP_HAS_FRAGS) reaches it as a
    multi-buffer packet: a page's worth in the linear part, the rest in frags. At xdp/PROG fcap's records hold the
    whole frame, the bytes `tcpdump -i` sees on the device after the program passed it, and their length counts
    the frags; the datagram reaches its socket."""
    from bpfprogs import TestProgram
    from bpf.uapi import ProgFlag
    from netns import read_packets, sh, start_tcpdump
    v = veth_ns
    _prog, rewrite, drop = _program(ProgType.XDP)
    _prog.close()
    try:
        prog = TestProgram(ProgType.XDP, _prog.name, rewrite, drop, flags=ProgFlag.XDP_HAS_FRAGS)
    except BPFError as e:
        pytest.skip(f"this kernel loads no multi-buffer XDP program (BPF_F_XDP_HAS_FRAGS, Linux 5.18+): {e}")
    try:
        reason = _refusal(prog.prog)
        if reason is not None:
            pytest.skip(f"this kernel refuses fentry on BPF programs: {reason}")
        sh("ip", "link", "set", v.a, "mtu", "9000")
        sh(*v.exec("ip", "link", "set", v.b, "mtu", "9000"))
        link = attach_device(prog.fileno(), v.a_index, AttachType.XDP, f"xdp.frags on {v.a}")
        out, seen = tmp_path / "out.pcapng", tmp_path / "tcpdump.pcap"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as r:
            r.bind((v.local, 0))
            r.settimeout(5)
            port = r.getsockname()[1]
            payload = bytes(i % 251 for i in range(JUMBO))
            td = start_tcpdump(v.a, seen, f"udp port {port}")
            fc = start_fcap(["-i", f"xdp/{prog.name}", "-w", str(out), f"udp port {port}"])
            try:
                subprocess.run(v.exec(sys.executable, "-c", "import socket, sys; socket.socket(socket.AF_INET, "
                                      "socket.SOCK_DGRAM).sendto(bytes(i % 251 for i in range(int(sys.argv[3]))), "
                                      "(sys.argv[1], int(sys.argv[2])))", v.local, str(port), str(JUMBO)),
                               check=True, timeout=60)
                assert r.recv(65536) == payload
            finally:
                link.close()
                assert fc.stop() == 0, fc.stderr
                assert td.stop() == 0, td.stderr
    finally:
        prog.close()
    frame = [p.raw for p in read_packets(str(seen))]
    assert len(frame) == 1 and len(frame[0]) == 14 + 20 + 8 + JUMBO, [len(f) for f in frame]
    recs = {p.iface_name: p for p in read_packets(str(out))}
    assert sorted(recs) == [f"xdp.entry/{prog.name}", f"xdp.exit/{prog.name}"], sorted(recs)
    for name, p in recs.items():
        assert (p.raw, p.orig_l3_len + 14) == (frame[0], len(frame[0])), (name, len(p.raw), p.orig_l3_len)
