"""In-kernel filtering on real packets: fcap with a filter keeps exactly the packets `tcpdump -r` keeps when
given fcap's own unfiltered capture of the same traffic (EN10MB, RAW and LINUX_SLL2), -F, -d, and bad
expressions.

All captures of a linktype run at once (one fcap process per expression, plus an unfiltered one) while one
traffic mix crosses lo, so each sees the same packets. The mix runs in a namespace of its own and every capture
is given `--netns` for it (a predicate, run before the filter), so other traffic on the machine's lo (a benchmark
flooding it) neither reaches the captures nor fills their buffers; only the mix's packets are compared."""

from __future__ import annotations

import random
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import need_root, need_tool

from filterutil import IN_VM, POINT, Captures, Mix, NetNS, multiset_diff, run_mix_in, tcpdump_filter
from netns import read_packets, run_fcap

GET_TCP = "tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x47455420"      # a TCP payload starting with "GET "
# The 200 KB TCP reply carries byte i % 251 at stream offset i, and its TCP header is 32 bytes (timestamps), so
# in each of its packets ip[52 + d] = (ip[52] + d) % 251: a load deep in the page frags (past the bytes the filter
# copies, by the slow path) and one straddling the end of the copy must find exactly that.
DEEP = "ip[20000] = (ip[52] + 119) % 251"                      # 19948 % 251 = 119


def straddle(link_hlen: int) -> str:
    """A 2-byte load whose second byte is the first packet byte the filter's copy does not hold."""
    from fcap.kernel.layout import FILTER_CAP
    first_out = FILTER_CAP - link_hlen        # as an ip[] offset
    return f"ip[{first_out - 1}:2] & 0xff = (ip[52] + {(first_out - 52) % 251}) % 251"


STRADDLE = straddle(14)                # EN10MB: the copy starts at the MAC header
STRADDLE_NET = straddle(0)             # RAW, LINUX_SLL2: the copy starts at the network header
F_EXPR = f"{GET_TCP} or udp port 2222"

# (expression, what the mix makes of it: "some" = libpcap keeps some of the mix's packets and drops others,
# "all", "none"); each expression needs to be able to fail: "some" ones are checked to be neither everything nor
# nothing of the mix.
EN10MB = [
    ("udp port 2222", "some"),
    ("tcp", "some"),
    ("ip6", "some"),
    ("icmp", "some"),
    ("icmp6", "some"),
    ("greater 1000", "some"),
    ("less 100", "some"),
    ("len = 58", "some"),    # the 16-byte UDP datagram: 14 + 20 + 8 + 16
    ("host 127.0.0.1 and udp", "some"),
    ("tcp[tcpflags] & tcp-syn != 0", "some"),
    ("udp[8:4] = 0x47455420", "some"),
    (GET_TCP, "some"),
    ("not port 2222", "some"),
    ("portrange 2000-3000", "some"),
    ("ip[2:2] > 600", "some"),
    ("ether proto 0x86dd", "some"),
    ("udp and len > 2000", "some"),
    ("ip6[48:4] = 0x47455420", "some"),
    ("tcp and len > 9000", "some"),         # big TCP skbs (GSO, payload in frags) on any kernel
    (DEEP, "some"),
    (STRADDLE, "some"),
    ("ether[12:2] = 0x800 and ip[9] = 17 and ip[6:2] & 0x3fff = 0", "some"),
]
RAW = [
    ("udp port 2222", "some"),
    ("len = 44", "some"),    # the 16-byte UDP datagram: 20 + 8 + 16
    ("ip6", "some"),
    ("greater 1000", "some"),
    ("icmp", "some"),
    (GET_TCP, "some"),
    (DEEP, "some"),
    (STRADDLE_NET, "some"),
]
SLL2 = [
    ("udp port 2222", "some"),
    ("ip6", "some"),
    ("tcp[tcpflags] & tcp-syn != 0", "some"),
    ("outbound", "all"),     # at net_dev_queue fcap writes PACKET_OUTGOING in the SLL2 header
    ("inbound", "none"),
    ("len = 64", "some"),    # the 16-byte UDP datagram: 20 + 20 + 8 + 16
    (GET_TCP, "some"),
    (DEEP, "some"),
    (STRADDLE_NET, "some"),
]
LINKTYPES = {"EN10MB": EN10MB, "RAW": RAW, "LINUX_SLL2": SLL2}
FRAGS = {GET_TCP, DEEP, STRADDLE, STRADDLE_NET}   # read page frags (bpf_dynptr_from_skb in tracing programs)
PING = {"icmp", "icmp6"}
V6 = {"ip6", "icmp6", "ether proto 0x86dd", "ip6[48:4] = 0x47455420"}
# extra captures in the EN10MB run: -F, the same expression as words, and a predicate proving where the payload
# lies ("skb->data_len > 0": bytes in page frags)
EXTRA = {"-F": None, "words": F_EXPR.split(), "frags-proof": ["--where", "skb->data_len > 0", GET_TCP]}
BATCH = 16 if IN_VM else 64      # fcap processes at once (the VM has 2 GiB; ~45 MB each)


def filter_sees_frags() -> bool:
    """Whether fcap's filter can read bytes in page frags at the test's point (the skb dynptr kfunc)."""
    from fcap.points import pointcaps
    from fcap.live.session import Config, Session
    s = Session(Config(points=[POINT], filter="tcp"))
    s.resolve()
    return pointcaps.dynptr_kfunc(s.points[0]) != 0


@dataclass
class Run:
    mix: Mix
    unfiltered: Path
    path: Path
    dir: Path


class Live:
    """Captures made on first use, one traffic run per batch of captures (each batch with its own unfiltered
    capture), cached for the module."""

    def __init__(self, factory, ns: NetNS):
        self.factory = factory
        self.ns = ns
        self.runs: dict[tuple[str, str], Run] = {}
        self.failed: dict[int, str] = {}
        self.frags = filter_sees_frags()
        self.batches: list[tuple[str, list[str]]] = []
        for lt, exprs in LINKTYPES.items():
            names = [e for e, _ in exprs] + (list(EXTRA) if lt == "EN10MB" else [])
            for i in range(0, len(names), BATCH - 1):
                self.batches.append((lt, names[i:i + BATCH - 1]))

    def args(self, name: str) -> list[str]:
        if name == "-F":
            f = self.factory.mktemp("ffile") / "filter"
            f.write_text(f"# tcpdump's -F: '#' starts a comment, lines are joined\n{GET_TCP}   # HTTP GET\n"
                         f"   or udp port 2222\n\n")
            return ["-F", str(f)]
        return EXTRA.get(name) or [name]

    def get(self, lt: str, name: str) -> Run:
        if (lt, name) not in self.runs:
            i = next(i for i, (blt, names) in enumerate(self.batches) if blt == lt and name in names)
            if i in self.failed:
                pytest.fail(f"the capture run of this expression failed (see the first failing test): "
                            f"{self.failed[i]}", pytrace=False)
            try:
                self._run(*self.batches[i])
            except BaseException as e:
                self.failed[i] = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise
        return self.runs[(lt, name)]

    def _run(self, lt: str, names: list[str]) -> None:
        d = self.factory.mktemp(f"live-{lt}")
        common = ["-y", lt, "-B", "2048", "--netns", str(self.ns.inum)]
        specs = {"": common} | {n: common + self.args(n) for n in names}
        with Captures(d, specs, ext="pcap") as caps:
            mix = run_mix_in(self.ns, random.randrange(1 << 30))
        for n in names:
            self.runs[(lt, n)] = Run(mix, caps[""].path, caps[n].path, d)
        self.runs[(lt, "")] = Run(mix, caps[""].path, caps[""].path, d)


def need_tool_or_none(name: str) -> str | None:
    import shutil
    return shutil.which(name)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    need_root()
    need_tool("tcpdump", "libpcap's verdicts come from tcpdump -r")
    need_tool("ip", "the traffic runs in a network namespace of its own")
    with NetNS() as ns:
        yield Live(tmp_path_factory, ns)


def _ours(run: Run, path: Path) -> list:
    return [p for p in read_packets(path) if run.mix.ours(p)]


def _reference(run: Run, expr: str) -> list:
    n = len(list(run.dir.glob("ref*.pcap")))
    return [p for p in tcpdump_filter(run.unfiltered, expr, run.dir / f"ref{n}.pcap") if run.mix.ours(p)]


def _check(live: Live, lt: str, name: str, expr: str, expect: str) -> None:
    run = live.get(lt, name)
    everything = _ours(run, run.unfiltered)
    got = _ours(run, run.path)
    want = _reference(run, expr)
    what = f"{lt} {expr!r}" + (f" ({name})" if name != expr else "")
    if expr in FRAGS and not live.frags:
        from collections import Counter

        from filterutil import key
        extra = Counter(map(key, got)) - Counter(map(key, want))
        assert not extra, f"{what}: {sum(extra.values())} kept packets libpcap rejects"
        pytest.skip(f"{what}: this kernel does not let tracing programs read page frags (no bpf_dynptr_from_skb "
                    f"kfunc for tp_btf), so the filter sees linear bytes only; checked only that it keeps no "
                    f"packet libpcap rejects ({len(got)} of {len(want)} kept)")
    diff = multiset_diff(got, want, what)
    assert diff is None, diff
    if expr in PING and not run.mix.pinged:
        return
    if expr in V6 and not run.mix.v6:
        return
    if expect == "some":
        assert 0 < len(want) < len(everything), (f"{what}: libpcap keeps {len(want)} of the mix's {len(everything)} "
                                                 f"packets: the expression tells nothing apart here")
    elif expect == "all":
        assert len(want) == len(everything) > 0, f"{what}: libpcap keeps {len(want)} of {len(everything)}"
    else:
        assert not want, f"{what}: libpcap keeps {len(want)} packets of the mix"


@pytest.mark.parametrize("expr, expect", EN10MB, ids=[e for e, _ in EN10MB])
def test_en10mb_filter_keeps_what_libpcap_keeps(live, expr, expect):
    _check(live, "EN10MB", expr, expr, expect)


@pytest.mark.parametrize("expr, expect", RAW, ids=[e for e, _ in RAW])
def test_raw_filter_keeps_what_libpcap_keeps(live, expr, expect):
    _check(live, "RAW", expr, expr, expect)


@pytest.mark.parametrize("expr, expect", SLL2, ids=[e for e, _ in SLL2])
def test_sll2_filter_keeps_what_libpcap_keeps(live, expr, expect):
    _check(live, "LINUX_SLL2", expr, expr, expect)


def test_unfiltered_capture_holds_the_whole_mix(live):
    """The reference is only as good as the unfiltered capture: every UDP datagram of the mix, the 200 KB TCP
    reply (large GSO skbs), and the IPv6 traffic are in it."""
    from filterutil import TCP_BIG, UDP6_PLAN
    from netns import flow_of
    run = live.get("EN10MB", "udp port 2222")
    pkts = _ours(run, run.unfiltered)
    flows = [flow_of(p) for p in pkts]
    udp4 = [f for f in flows if f.proto == 17 and ":" not in f.src]
    assert len(udp4) == run.mix.sent["udp4"], f"{len(udp4)} of {run.mix.sent['udp4']} UDP/IPv4 datagrams"
    reply = [p for p, f in zip(pkts, flows) if f.proto == 6 and f.sport == 2600]
    payload = sum(p.orig_l3_len - 20 - (p.l3[32] >> 4) * 4 for p in reply)
    assert payload == TCP_BIG, f"the TCP reply adds up to {payload} bytes, not {TCP_BIG}"
    assert max(p.orig_l3_len for p in reply) > 20000, "no TCP skb longer than 20 KB: nothing reaches page frags"
    plain = [p for p in reply if p.l3[32] >> 4 == 8 and len(p.l3) > 20001]   # 32-byte TCP header (timestamps)
    assert plain, "no long reply packet with a 32-byte TCP header: DEEP and STRADDLE rely on one"
    assert all(p.l3[52 + d] == (p.l3[52] + d) % 251 for p in plain for d in (19948, 446, 460)), \
        "the reply's bytes are not the pattern DEEP and STRADDLE rely on"
    if run.mix.v6:
        udp6 = [f for f in flows if f.proto == 17 and ":" in f.src]
        assert len(udp6) == len(UDP6_PLAN)


def test_filter_file_equals_words(live):
    """-F FILE (comments, several lines) keeps what the same expression given as words keeps, and what libpcap
    keeps."""
    f = live.get("EN10MB", "-F")
    w = live.get("EN10MB", "words")
    got_f, got_w = _ours(f, f.path), _ours(w, w.path)
    want = _reference(f, F_EXPR)
    assert want, "the expression keeps nothing of the mix"
    if not live.frags:
        pytest.skip("the filter sees linear bytes only on this kernel (no skb dynptr): -F checked by -d below")
    assert multiset_diff(got_f, got_w, "-F vs words") is None
    assert multiset_diff(got_f, want, f"-F {F_EXPR!r}") is None


def test_payload_in_frags_is_filtered(live):
    """The "GET " segments lie in page frags (a capture with --where 'skb->data_len > 0' and the same filter
    keeps all of them), and the filter still finds them."""
    run = live.get("EN10MB", "frags-proof")
    want = _reference(run, GET_TCP)
    assert len(want) == 1, f"{len(want)} TCP/IPv4 segments start with 'GET ' (libpcap's tcp[] is IPv4 only)"
    if not live.frags:
        pytest.skip("this kernel lets tracing programs read linear bytes only (no bpf_dynptr_from_skb kfunc)")
    diff = multiset_diff(_ours(run, run.path), want, "--where 'skb->data_len > 0' + GET filter")
    assert diff is None, f"{diff}\n(the GET segments are not all in page frags, or the filter missed them)"


# ---- -F, -d, errors (no traffic) ------------------------------------------------------------------------

def _empty_pcap(path: Path, linktype: int = 1) -> Path:
    from fcap.files.pcapfile import PcapWriter
    with open(path, "wb") as f:
        w = PcapWriter(f, linktype=linktype, snaplen=262144)
        w.close()
    return path


def test_dump_prints_cbpf_and_ebpf_and_exits(tmp_path, root):
    """-d: libpcap's cBPF as tcpdump -d prints it (same lines as tcpdump's), then the generated eBPF; exit 0
    by itself, without attaching (no 'listening on')."""
    r = run_fcap(["-d", "-i", POINT, "udp", "port", "2222"], timeout=60)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    assert "listening on" not in err and "captured" not in err, err
    assert "Traceback" not in err
    lines = out.splitlines()
    assert lines[0] == "; cBPF (libpcap)"
    cbpf = [ln for ln in lines if re.match(r"^\(\d{3}\) ", ln)]
    assert cbpf[0].split() == ["(000)", "ldh", "[12]"], cbpf[0]
    assert cbpf[-1].split()[1] == "ret"
    ebpf_head = next(i for i, ln in enumerate(lines) if ln.startswith(f"; {POINT}"))
    ebpf = [ln for ln in lines[ebpf_head + 1:] if re.match(r"^\s*\d+: ", ln)]
    assert len(ebpf) > 50, f"{len(ebpf)} eBPF lines"
    assert any("exit" in ln for ln in ebpf)
    assert any("call" in ln for ln in ebpf)
    if need_tool_or_none("tcpdump"):
        pcap = _empty_pcap(tmp_path / "empty.pcap")
        t = subprocess.run(["tcpdump", "-r", str(pcap), "-d", "udp port 2222"], capture_output=True, text=True)
        assert t.returncode == 0, t.stderr
        assert [ln.split() for ln in cbpf] == [ln.split() for ln in t.stdout.splitlines()], \
            f"fcap -d:\n{chr(10).join(cbpf)}\ntcpdump -d:\n{t.stdout}"


def test_dump_from_file_equals_words(tmp_path, root):
    f = tmp_path / "flt"
    f.write_text("# a comment\ntcp port 80   # web\n  and greater 100\n")
    a = run_fcap(["-d", "-i", POINT, "-F", str(f)])
    b = run_fcap(["-d", "-i", POINT, "tcp", "port", "80", "and", "greater", "100"])
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout
    c = run_fcap(["-d", "-i", POINT, "-y", "RAW", "tcp port 80 and greater 100"])
    assert c.returncode == 0 and c.stdout != a.stdout, "the linktype does not change the compiled filter"


@pytest.mark.parametrize("args, words", [
    (["udp port"], "syntax error"),
    (["tcp[99999999999]"], "syntax error"),
    (["proto", "foo"], "unknown ip proto 'foo'"),
    (["-y", "RAW", "ether host 1:2:3:4:5:6"], "ethernet addresses supported only on"),
    (["-y", "RAW", "vlan and"], "VLAN"),
    (["-F", "/nonexistent/fcap-filter"], "No such file or directory"),
])
def test_bad_expression_is_one_line(args, words, root):
    r = run_fcap(["-i", POINT, "-w", "/dev/null", *args])
    err = r.stderr.decode()
    assert r.returncode != 0
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fcap: ") and words in err, err
    assert "listening on" not in err


def test_udp_port_filter_on_lo(tmp_path, root):
    """Small live check without tcpdump: 'udp port P' keeps exactly the datagrams sent to P, none to Q."""
    from filterutil import send_udp_from
    from netns import UDPSink, flow_of
    with UDPSink("127.0.0.1") as p, UDPSink("127.0.0.1") as q:
        with Captures(tmp_path, {"p": [f"udp dst port {p.port}"]}) as caps:
            send_udp_from("127.0.0.1", "127.0.0.1", p.port, [b"p" * n for n in (1, 500, 5000)])
            send_udp_from("127.0.0.1", "127.0.0.1", q.port, [b"q" * n for n in (1, 500, 5000)])
            p.wait(3)
            q.wait(3)
    got = read_packets(caps["p"].path)
    assert sorted(len(x.l3) - 28 for x in got) == [1, 500, 5000]
    assert all(flow_of(x).dport == p.port and flow_of(x).proto == socket.IPPROTO_UDP for x in got)
