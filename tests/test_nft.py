"""--nft: which nftables table, chain and rule dropped each packet netfilter dropped (fcap.host.nftrace over
fcap.host.nftables). The netlink encoding read back by the kernel and by `nft` itself; then live, with real
nftables tables made by `nft` dropping chosen datagrams between veth namespaces: each NETFILTER_DROP record names the
table, chain and the rule handle `nft -a -j list` shows for the rule that dropped it (a rule in a base chain, one in a
chain jumped to, a chain's policy), a packet dropped for another reason is not attributed, in the comment, --json,
fcap.read(), the API and printed lines; and fcap's trace table is gone after it exits, ends on SIGINT or is
killed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcap.host import nftables as nft
from fcap.host import nftrace
from conftest import need_root
from netns import SLOW, free_port, run_fcap, start_fcap, subprocess_env

# ---- the netlink encoding (pure) ---------------------------------------------------------------------------------


def test_attributes_round_trip():
    data = nft.string(1, "filter") + nft.be32(4, 3) + nft.nested(5, nft.be32(1, -1), nft.string(2, "sub"))
    a = nft.parse_attrs(data)
    assert a[1] == b"filter\0" and struct.unpack("!I", a[4])[0] == 3
    v = nft.parse_attrs(a[5])
    assert struct.unpack("!i", v[1])[0] == -1 and v[2] == b"sub\0"
    assert all(len(x) % 4 == 0 for x in (nft.string(1, "ab"), nft.attr(2, b"\1\2\3\4\5")))


def _trace_msg(family, table, chain, kind, tid, handle=None, code=None, policy=None, network=None, transport=None,
               mark=0) -> bytes:
    attrs = [nft.string(nft.TRACE_TABLE, table), nft.string(nft.TRACE_CHAIN, chain), nft.be32(nft.TRACE_TYPE, kind),
             nft.be32(nft.TRACE_ID, tid), nft.be32(nft.TRACE_NFPROTO, 2)]
    if handle is not None:
        attrs.append(nft.attr(nft.TRACE_RULE_HANDLE, struct.pack("!Q", handle)))
    if code is not None:
        attrs.append(nft.nested(nft.TRACE_VERDICT, nft.be32(nft.VERDICT_CODE, code)))
    if policy is not None:
        attrs.append(nft.be32(nft.TRACE_POLICY, policy))
    if network is not None:
        attrs.append(nft.attr(nft.TRACE_NETWORK_HEADER, network))
    if transport is not None:
        attrs.append(nft.attr(nft.TRACE_TRANSPORT_HEADER, transport))
    if mark:
        attrs.append(nft.be32(nft.TRACE_MARK, mark))
    return nft.message(nft.nft_type(nft.Msg.TRACE), 0, 0, family, b"".join(attrs))


IP = bytes.fromhex("4500002100004000401100007f0000017f000001")
UDP = struct.pack("!HHHH", 40000, 9999, 13, 0) + b"hello"


def test_trace_events_parse():
    msgs = _trace_msg(1, "filter", "input", nft.TraceType.RULE, 7, handle=5, code=nft.NF_DROP, network=IP,
                      transport=UDP) + _trace_msg(2, "t", "c", nft.TraceType.POLICY, 8, policy=nft.NF_DROP) \
        + _trace_msg(1, "t", "c", nft.TraceType.RULE, 9, handle=3, code=-3)
    (k1, _f, _s, p1), (_k2, _f2, _s2, p2), (_k3, _f3, _s3, p3) = nft.split(msgs)
    assert k1 == nft.nft_type(nft.Msg.TRACE)
    t1, t2, t3 = (nft.parse_trace(p) for p in (p1, p2, p3))
    assert (t1.family, t1.table, t1.chain, t1.rule, t1.verdict, t1.network, t1.transport) == \
        ("inet", "filter", "input", 5, 0, IP, UDP)
    assert t1.decides_drop() and t2.decides_drop() and (t2.family, t2.rule) == ("ip", None)
    assert not t3.decides_drop() and t3.verdict == -3


# ---- the trace socket's program (fcap.kernel.nftfilter), run by the kernel on made-up events ----------------------

@pytest.fixture(scope="module")
def key_program():
    """The socket filter loaded over fresh maps: (run(message) -> (return value, the slot's drop_rule, drop_len,
    drop_hdr), the texts map); run by BPF_PROG_TEST_RUN (a socket filter sees the data past a 14-byte Ethernet
    header)."""
    from bpf import prog
    from bpf.maps import HashMap, PerCPUArrayMap
    from bpf.uapi import MapFlags, ProgType
    from fcap.kernel import nftfilter
    from fcap.kernel.layout import NFT_SLOT, NFT_TEXT, NFT_TEXT_KEY
    need_root()
    slots = PerCPUArrayMap(NFT_SLOT.size, 1, name="t_nftslot")
    texts = HashMap(NFT_TEXT_KEY.size, NFT_TEXT.size, 64, name="t_nfttext", flags=MapFlags.NO_PREALLOC)
    p = prog.load(ProgType.SOCKET_FILTER, nftfilter.program(slots.fileno(), texts.fileno(), NETNS), name="t_nft")

    def run(message: bytes):
        slots.update(0, bytes(slots.stride * slots.ncpus))
        ret = p.test_run(bytes(14) + message)[0]
        got = [NFT_SLOT.unpack(v) for v in slots.lookup_percpu(0) if NFT_SLOT.unpack(v).drop_rule]
        s = got[0] if got else None
        return ret, (s.drop_rule, s.drop_len, s.drop_hdr) if s else (0, 0, b"")
    yield run, texts
    p.close()
    slots.close()
    texts.close()


NETNS = 4026531840
NAMES = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=255)


@settings(max_examples=60, deadline=None)
@given(NAMES, NAMES, st.integers(0, 2**64 - 1), st.sampled_from([1, 2, 10]), st.booleans(),
       st.binary(min_size=1, max_size=40))
def test_the_kernels_key_is_pythons(key_program, table, chain, handle, family, policy, header):
    """The rule key the program makes in the kernel from a drop verdict is rule_key()'s, for names of every length
    up to nft's 255 (each word of 8, the last one cut), any handle, family, rule or policy; it keeps the verdict's
    first header bytes; it lets the event through once its key is unknown, and marks it pending."""
    from fcap.kernel import nftfilter
    from fcap.kernel.layout import NFT_HDR
    run, texts = key_program
    kind = nft.TraceType.POLICY if policy else nft.TraceType.RULE
    msg = _trace_msg(family, table, chain, kind, 77, handle=None if policy else handle,
                     code=None if policy else nft.NF_DROP, policy=nft.NF_DROP if policy else None, network=header,
                     transport=UDP)
    payload = msg[16:]
    want = nftfilter.event_key(payload, NETNS)
    assert want == nftfilter.rule_key(family, 2 if policy else 1, (chain + "\0").encode(), (table + "\0").encode(),
                                      struct.pack("!Q", handle), NETNS)
    ret, (key, hlen, hdr) = run(msg)
    assert key == want and hlen == min(len(header), NFT_HDR) and hdr == header[:NFT_HDR].ljust(NFT_HDR, b"\0")
    assert ret == 0xFFFFFFFF and texts.lookup(key.to_bytes(8, "little")) is not None   # (now pending)
    assert run(msg)[0] == 0
    texts.delete(key.to_bytes(8, "little"))


def test_the_program_keeps_no_verdict_but_drops(key_program):
    """An accept, a continue, a chain's end, a drop of another trace id than the headers': no key, nothing queued."""
    run, _texts = key_program
    for msg in (_trace_msg(1, "t", "c", nft.TraceType.RULE, 5, handle=3, code=nft.NF_ACCEPT, network=IP),
                _trace_msg(1, "t", "c", nft.TraceType.RULE, 5, handle=3, code=-1, network=IP),
                _trace_msg(1, "t", "c", nft.TraceType.RETURN, 5, code=-1, network=IP),
                _trace_msg(1, "t", "c", nft.TraceType.POLICY, 5, policy=nft.NF_ACCEPT, network=IP),
                _trace_msg(1, "t", "c", nft.TraceType.RULE, 5, handle=3, code=nft.NF_DROP)):
        assert run(msg) == (0, (0, 0, b""))


def test_names_with_spaces_stay_one_word_of_the_comment():
    from fcap.features.nft_rule import COMMENT
    from fcap.features.unit import keyed_text
    d = nftrace.Decision("inet", "my table", "in put", None)
    assert keyed_text(COMMENT, d.values()) == \
        " nft_family=inet nft_table=my\\x20table nft_chain=in\\x20put nft_policy=drop"
    from fcap.api import parse_comment
    base = "skb=0x" + "0" * 16 + " pid=1 tid=1 comm=x ifindex=1 mark=0x0 netns=1 proto=0x0800 pkt_type=0 len=1"
    assert parse_comment(base + " reason=NETFILTER_DROP at=nf_hook_slow+0x1" + keyed_text(COMMENT, d.values()))[
        "nft_table"] == "my\\x20table"


def test_what_counts_as_a_netfilter_drop():
    assert nftrace.is_netfilter_drop("NETFILTER_DROP", "nf_hook_slow+0x9f")
    assert not nftrace.is_netfilter_drop("NO_SOCKET", "__udp4_lib_rcv+0x4bc")
    assert nftrace.is_netfilter_drop(None, "nf_hook_slow+0x9f")          # before 5.17: no reason, the location
    assert not nftrace.is_netfilter_drop(None, "kfree_skb_list+0x1")


def test_the_comment_declares_its_keys_for_wireshark():
    from fcap.commands.wireshark import comment_fields
    keys = {key: (name, style) for key, name, style in comment_fields()}
    assert keys["nft_rule"] == ("nft_rule", "dec64") and keys["nft_table"] == ("nft_table", "str")
    assert {"nft_family", "nft_chain", "nft_policy"} <= set(keys)


# ---- live: real nftables tables dropping chosen datagrams between veth namespaces ---------------------------------

def _need_nft():
    if shutil.which("nft") is None:
        pytest.skip("no nft command (Debian: nftables): the test's own rules are made with it")
    r = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"nftables is not usable here: {r.stderr.strip()}")


@pytest.fixture
def veth(root):
    _need_nft()
    from netns import make_veth_ns, remove_veth_ns
    v = make_veth_ns()
    try:
        yield v
    finally:
        remove_veth_ns(v)


class Table:
    """A table of the test's own (`nft -f`), in the host's namespace or in `ns`; deleted at the end, also when the
    test fails."""

    def __init__(self, text: str, name: str, ns: str | None = None):
        self.name, self.ns = name, ns
        r = subprocess.run(self._argv("-f", "-"), input=text, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr

    def _argv(self, *args: str) -> list[str]:
        return (["ip", "netns", "exec", self.ns] if self.ns else []) + ["nft", *args]

    def handles(self) -> dict:
        """{rule comment: (chain, handle)} as `nft -a -j list table` shows them."""
        r = subprocess.run(self._argv("-a", "-j", "list", "table", "inet", self.name), capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        rules = [i["rule"] for i in json.loads(r.stdout)["nftables"] if "rule" in i]
        return {rule["comment"]: (rule["chain"], rule["handle"]) for rule in rules if "comment" in rule}

    def delete(self) -> None:
        subprocess.run(self._argv("delete", "table", "inet", self.name), capture_output=True, timeout=30)


def trace_tables(ns: str | None = None) -> list[str]:
    """The tables fcap's --nft made (inet fcap_nftrace_PID) in the host's namespace or in `ns`."""
    argv = (["ip", "netns", "exec", ns] if ns else []) + ["nft", "list", "tables"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    return re.findall(rf"table inet ({nftrace.TABLE_PREFIX}\d+)", out)


SEND = "import socket, sys\n" \
       "s = socket.socket(2, 2)\n" \
       "for arg in sys.argv[2:]:\n" \
       "    port, text = arg.split(':', 1)\n" \
       "    try:\n" \
       "        s.sendto(text.encode(), (sys.argv[1], int(port)))\n" \
       "    except OSError:\n" \
       "        pass\n"   # (a datagram dropped at output: EPERM)


def send(dst: str, datagrams: list[tuple[int, str]], ns: str | None = None) -> None:
    argv = (["ip", "netns", "exec", ns] if ns else []) + [sys.executable, "-c", SEND, dst] + \
        [f"{port}:{text}" for port, text in datagrams]
    subprocess.run(argv, check=True, timeout=30, env=subprocess_env())


def _nf_drop(p) -> bool:
    """A netfilter drop: reason NETFILTER_DROP; before 5.17 (no reasons), freed in nf_hook_slow."""
    return nftrace.is_netfilter_drop(p.reason, p.location)


def _text(p) -> str:
    return bytes(p.data[-4:]).decode(errors="replace")


def test_nft_names_the_rule_of_each_netfilter_drop(veth, tmp_path):
    """fcap in the peer's namespace (ip netns exec), whose table of the test's own drops datagrams the host sends in
    (a rule of the input chain, a rule of a chain it jumps to) and datagrams it sends out (the output chain); a
    datagram the rules accept is dropped later for want of a socket. Each NETFILTER_DROP record names the table,
    the chain holding the rule and the handle `nft -a` shows for it; the NO_SOCKET ones name none; fcap's trace table
    is in that namespace while it runs (none in the host's) and gone after."""
    v = veth
    p1, p2, p3, p4 = (free_port() for _ in range(4))
    name = f"fcapnft{os.getpid() % 100000}"
    table = Table(f"""table inet {name} {{
        chain inp {{ type filter hook input priority 0; policy accept;
            iifname "{v.b}" udp dport {p1} counter drop comment "p1"
            iifname "{v.b}" udp dport {p2} jump sub comment "jump"
        }}
        chain sub {{ udp dport {p2} counter drop comment "p2"; }}
        chain out {{ type filter hook output priority 0; policy accept;
            oifname "{v.b}" udp dport {p4} counter drop comment "p4"
        }}
    }}""", name, ns=v.ns)
    try:
        handles = table.handles()
        path = tmp_path / "nft.pcapng"
        flt = f"udp and (dst port {p1} or dst port {p2} or dst port {p3} or dst port {p4})"
        fc = start_fcap(["-i", "skb:drop", "--nft", "-c", "8", "-w", str(path), flt], netns=v.ns)
        try:
            assert trace_tables(v.ns) == [f"{nftrace.TABLE_PREFIX}{fc.pid}"] and trace_tables() == []
            send(v.peer, [(p1, "p1-a"), (p2, "p2-a"), (p3, "p3-a"), (p1, "p1-b"), (p2, "p2-b"), (p3, "p3-b")])
            send(v.local, [(p4, "p4-a"), (p4, "p4-b")], ns=v.ns)
            assert fc.wait() == 0, fc.stderr
        finally:
            fc.kill()
        assert trace_tables(v.ns) == [], "fcap left its trace table behind"
        import fcap
        got = {_text(p): p for p in fcap.read(str(path))}
        assert sorted(got) == ["p1-a", "p1-b", "p2-a", "p2-b", "p3-a", "p3-b", "p4-a", "p4-b"]
        want = {"p1": ("inp", handles["p1"][1]), "p2": ("sub", handles["p2"][1]), "p4": ("out", handles["p4"][1])}
        for key, p in got.items():
            rule = key.split("-")[0]
            if rule == "p3":
                assert not _nf_drop(p) and p.nft_rule is None and "nft_" not in p.comment, p.comment
                continue
            assert _nf_drop(p), p.comment
            assert (p.nft_family, p.nft_table, p.nft_chain, p.nft_rule, p.nft_policy) == \
                ("inet", name, *want[rule], None), (p.comment, fc.stderr)
            assert f" nft_family=inet nft_table={name} nft_chain={want[rule][0]} nft_rule={want[rule][1]}" \
                in p.comment
        r = run_fcap(["-r", str(path), "--json"])
        objs = [json.loads(line) for line in r.stdout.decode().splitlines()]
        assert r.returncode == 0 and len(objs) == 8
        assert sorted(str((o.get("nft_table"), o.get("nft_chain"), o.get("nft_rule"))) for o in objs) == sorted(
            str((p.nft_table, p.nft_chain, p.nft_rule)) for p in got.values())
    finally:
        table.delete()


def test_a_chains_policy_printed_and_the_table_gone_after_sigint(veth):
    """A base chain of policy drop in the peer's namespace: its drops name the chain and nft_policy=drop, no rule,
    on fcap's printed lines (-l); a datagram a rule accepts names nothing; SIGINT ends fcap and its table goes."""
    v = veth
    p_in, p_ok = free_port(), free_port()
    name = f"fcapnftp{os.getpid() % 100000}"
    table = Table(f"""table inet {name} {{
        chain inp {{ type filter hook input priority 0; policy drop;
            udp dport {p_ok} accept comment "ok"
            meta l4proto != udp accept
        }}
    }}""", name, ns=v.ns)
    try:
        fc = start_fcap(["-i", "skb:drop", "--nft", "-l", f"udp and (dst port {p_in} or dst port {p_ok})"],
                        netns=v.ns, stdout=subprocess.PIPE)
        try:
            send(v.peer, [(p_in, "in-a"), (p_ok, "ok-a"), (p_in, "in-b")])
            deadline = time.monotonic() + 30 * SLOW
            lines: list[str] = []
            while len(lines) < 3 and time.monotonic() < deadline:
                line = fc.p.stdout.readline().decode()
                if not line:
                    break
                lines.append(line)
            assert trace_tables(v.ns) == [f"{nftrace.TABLE_PREFIX}{fc.pid}"]
            assert fc.stop(signal.SIGINT) == 0, fc.stderr
        finally:
            fc.kill()
        assert trace_tables(v.ns) == [], "fcap left its trace table behind after SIGINT"
        dropped = [ln for ln in lines if f".{p_in}: UDP" in ln]
        accepted = [ln for ln in lines if f".{p_ok}: UDP" in ln]
        assert len(dropped) == 2 and len(accepted) == 1, lines
        for ln in dropped:
            assert f"nft_family=inet nft_table={name} nft_chain=inp nft_policy=drop]" in ln and "nft_rule" not in ln, ln
            assert "reason=NETFILTER_DROP" in ln or "reason=" not in ln and "at=nf_hook_slow" in ln, ln
        assert "nft_" not in accepted[0] and "NETFILTER_DROP" not in accepted[0], accepted
    finally:
        table.delete()


def test_a_killed_fcaps_table_goes_with_its_socket(veth):
    """SIGKILL: nothing of fcap runs, yet its trace table goes (owned by its netlink socket, Linux 5.12+; on older
    kernels it stays, and the test deletes it)."""
    v = veth
    fc = start_fcap(["-i", "skb:drop", "--nft", "-w", "/dev/null"], netns=v.ns)
    try:
        table = f"{nftrace.TABLE_PREFIX}{fc.pid}"
        assert trace_tables(v.ns) == [table]
        fc.p.kill()
        fc.wait()
    finally:
        fc.kill()
    left = trace_tables(v.ns)
    release = tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
    if release < (5, 12):
        subprocess.run(["ip", "netns", "exec", v.ns, "nft", "delete", "table", "inet", table], timeout=30)
        assert left == [table]
    else:
        assert left == [], f"a killed fcap left {left} (owner tables: Linux 5.12+)"


def test_the_api_names_the_rule_in_this_namespace(veth):
    """fcap.capture(nft=True) in the test's own (the host's) namespace: a rule of the test's table drops datagrams
    sent to the peer at output; the Packet names it."""
    import fcap
    v = veth
    port = free_port()
    name = f"fcapnfta{os.getpid() % 100000}"
    table = Table(f"""table inet {name} {{
        chain out {{ type filter hook output priority 0; policy accept;
            oifname "{v.a}" udp dport {port} drop comment "api"
        }}
    }}""", name)
    try:
        handle = table.handles()["api"][1]
        with fcap.capture("skb:drop", filter=f"udp dst port {port}", count=2, nft=True, timeout=30 * SLOW) as cap:
            send(v.peer, [(port, "api1"), (port, "api2")])
            got = list(cap)
            lost = cap.session.nft.lost if cap.session is not None else 0
        assert trace_tables() == []
        if lost and any(p.nft_rule is None for p in got):
            pytest.skip(f"this host's other traffic overflowed the trace socket ({lost} reads failed: ENOBUFS)")
        assert [(_nf_drop(p), p.nft_table, p.nft_chain, p.nft_rule) for p in got] == [(True, name, "out", handle)] * 2
    finally:
        table.delete()


FILTERED = r"""
import socket, sys, time
from bpf.maps import HashMap, PerCPUArrayMap
from bpf.uapi import MapFlags
from fcap.host import nftables as nft, nftrace
from fcap.kernel import nftfilter
from fcap.kernel.layout import NFT_SLOT, NFT_TEXT
ok, no = int(sys.argv[1]), int(sys.argv[2])
slots = PerCPUArrayMap(NFT_SLOT.size, 1, name="t_nftslot")
texts = HashMap(8, NFT_TEXT.size, 64, name="t_nfttext", flags=MapFlags.NO_PREALLOC)
t = nftrace.Tracer(lambda sock, netns: nftfilter.attach(sock, slots.fileno(), texts.fileno(), netns))
every = nft.NfSocket(trace=True, rcvbuf=1 << 22)     # no filter: every event
r = socket.socket(2, 2)
r.bind(("127.0.0.1", ok))
s = socket.socket(2, 2)
for i in range(20):
    s.sendto(b"ok", ("127.0.0.1", ok))
for i in range(3):
    try:
        s.sendto(b"no", ("127.0.0.1", no))
    except OSError:
        pass
time.sleep(0.2)
kept, all_ = t.listener.trace_payloads()[0], every.trace_payloads()[0]
t.close()
drops = lambda events: sum(nft.parse_trace(e).decides_drop() for e in events)
print(len(kept), drops(kept), len(all_), drops(all_), len(list(texts.keys())))
"""


def test_the_socket_filter_queues_one_drop_verdict_per_rule(veth):
    """fcap.kernel.nftfilter in the kernel: of 20 datagrams a rule accepts (at input) and 3 a rule drops (at output),
    fcap's trace socket gets the first drop verdict only (its rule's key then pending in the texts map), where a
    socket without the program gets each chain's events (fcap's own two, the output chain's end and policy, the
    input chain's accept, the 3 drops)."""
    v = veth
    ok, no = free_port(), free_port()
    name = f"fcapnftf{os.getpid() % 100000}"
    table = Table(f"""table inet {name} {{
        chain out {{ type filter hook output priority 0; policy accept; udp dport {no} drop; }}
        chain inp {{ type filter hook input priority 0; policy accept; udp dport {ok} accept; }}
    }}""", name, ns=v.ns)
    try:
        r = subprocess.run(["ip", "netns", "exec", v.ns, sys.executable, "-c", FILTERED, str(ok), str(no)],
                           capture_output=True, text=True, timeout=60 * SLOW, env=subprocess_env())
        assert r.returncode == 0, r.stderr
        kept, kept_drops, every, every_drops, keys = map(int, r.stdout.split())
        assert (kept, kept_drops, keys) == (1, 1, 1), r.stdout
        assert every >= 20 * 5 and every_drops == 3, r.stdout
        assert trace_tables(v.ns) == []
    finally:
        table.delete()


@pytest.fixture
def two_veths(root):
    _need_nft()
    from netns import make_veth_ns, remove_veth_ns
    a = make_veth_ns()
    try:
        b = make_veth_ns()
        try:
            yield a, b
        finally:
            remove_veth_ns(b)
    finally:
        remove_veth_ns(a)


def _ns_inode(ns: str) -> int:
    return os.stat(f"/run/netns/{ns}").st_ino


@pytest.mark.parametrize("where", ["names", "all"])
def test_nft_names_the_rules_of_two_other_namespaces_at_once(two_veths, tmp_path, where):
    """fcap in the host's namespace, --nft-netns naming two others (`ip netns` names; or all: every one found), each
    with a table of the test's own dropping a port: each NETFILTER_DROP record names its own namespace's table,
    chain and handle, and that namespace (nft_netns: its inode number, as `ip netns` bind-mounts it); fcap's trace
    table is in the host's and both namespaces while it runs and in none after."""
    a, b = two_veths
    port = free_port()
    tables = []
    try:
        for v, tag in ((a, "a"), (b, "b")):
            name = f"fcapnft{tag}{os.getpid() % 100000}"
            tables.append(Table(f"""table inet {name} {{
                chain inp {{ type filter hook input priority 0; policy accept;
                    udp dport {port} counter drop comment "{tag}"
                }}
            }}""", name, ns=v.ns))
        handles = [t.handles() for t in tables]
        path = tmp_path / "nft.pcapng"
        netns_flags = ["--nft-netns", a.ns, "--nft-netns", b.ns] if where == "names" else ["--nft-netns", "all"]
        fc = start_fcap(["-i", "skb:drop", "--nft", *netns_flags, "-c", "4", "-w", str(path),
                         f"udp dst port {port}"])
        try:
            mine = f"{nftrace.TABLE_PREFIX}{fc.pid}"
            assert mine in trace_tables() and trace_tables(a.ns) == trace_tables(b.ns) == [mine]
            send(a.peer, [(port, "a--1"), (port, "a--2")])
            send(b.peer, [(port, "b--1"), (port, "b--2")])
            assert fc.wait() == 0, fc.stderr
        finally:
            fc.kill()
        assert mine not in trace_tables() and trace_tables(a.ns) == trace_tables(b.ns) == [], "trace tables left"
        import fcap
        got = {_text(p): p for p in fcap.read(str(path))}
        assert sorted(got) == ["a--1", "a--2", "b--1", "b--2"], fc.stderr
        for key, p in got.items():
            i = "ab".index(key[0])
            v, t, h = (a, b)[i], tables[i], handles[i][key[0]]
            assert _nf_drop(p), p.comment
            assert (p.nft_table, p.nft_chain, p.nft_rule, p.nft_netns) == (t.name, "inp", h[1], _ns_inode(v.ns)), \
                (p.comment, fc.stderr)
            assert p.netns == p.nft_netns and f" nft_netns={p.nft_netns}" in p.comment
    finally:
        for t in tables:
            t.delete()


@pytest.mark.parametrize("args,message", [
    (["-i", "skb:drop", "--nft-netns", "x", "-c", "1"], "--nft-netns says where --nft looks: give --nft too"),
    (["-i", "skb:drop", "--nft", "--nft-netns", "fcap-no-such-ns", "-c", "1"],
     "--nft-netns fcap-no-such-ns: no such network namespace"),
    (["-i", "tp_btf/net_dev_queue", "--nft", "-c", "1"], "--nft names the nftables rule of each netfilter drop"),
    (["-i", "skb:drop", "--nft", "-c", "1", "-w", "x.pcap"], "--nft: a pcap file has no room"),
])
def test_nft_usage_errors_are_one_line(root, tmp_path, args, message):
    r = run_fcap(args, cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode != 0 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "x.pcap").exists()


def test_wiresharks_fcap_fields_select_the_rule(veth, tmp_path, tshark):
    """The Lua dissector `fcap extcap --install` makes from the comment's declaration: fcap.nft_rule == HANDLE and
    fcap.nft_chain select exactly the packets fcap.read() says that rule dropped."""
    import fcap
    from test_wireshark_lua import _numbers, _rows
    v = veth
    p1, p2 = free_port(), free_port()
    name = f"fcapnftw{os.getpid() % 100000}"
    table = Table(f"""table inet {name} {{
        chain inp {{ type filter hook input priority 0; policy accept;
            udp dport {p1} drop comment "w1"
            udp dport {p2} drop comment "w2"
        }}
    }}""", name, ns=v.ns)
    try:
        handles = table.handles()
        path = tmp_path / "w.pcapng"
        fc = start_fcap(["-i", "skb:drop", "--nft", "-c", "3", "-w", str(path),
                         f"udp and (dst port {p1} or dst port {p2})"], netns=v.ns)
        try:
            send(v.peer, [(p1, "w1-a"), (p2, "w2-a"), (p1, "w1-b")])
            assert fc.wait() == 0, fc.stderr
        finally:
            fc.kill()
    finally:
        table.delete()
    env = subprocess_env()
    env["HOME"] = str(tmp_path / "home")
    env.pop("XDG_CONFIG_HOME", None)
    assert run_fcap(["extcap", "--install"], env=env).returncode == 0
    got = list(fcap.read(str(path)))
    for comment, (_chain, handle) in handles.items():
        want = [i + 1 for i, p in enumerate(got) if p.nft_rule == handle]
        assert len(want) == (2 if comment == "w1" else 1)
        assert _numbers(tshark, env, path, f"fcap.nft_rule == {handle} && fcap.nft_chain == \"inp\"") == want
    rows = _rows(tshark, env, path, "fcap.nft_table", "fcap.nft_family")
    assert rows == [[name, "inet"]] * 3
