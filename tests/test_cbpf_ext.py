"""cBPF translation past classic BPF's limits, run in the kernel: libpcap's protochain (a loop: the IPv6
extension-header and IPv4 AH walk) against libpcap's own verdicts over the corpus's IPv6 captures and crafted
chains, and Linux ancillary loads (`inbound`, `outbound`, SKF_AD_*) against the skb the kernel's test run
builds."""

from __future__ import annotations

import os
import random
import struct
import time

import pytest

from bpf import cbpf

import cbpf_harness as H

kernel = pytest.mark.skipif(H.kernel_reason() is not None, reason=f"kernel tests: {H.kernel_reason()}")

# ---- protochain -------------------------------------------------------------------------------------

NEXT = [0, 6, 17, 43, 44, 47, 50, 51, 58, 59, 60, 253]
PROTOCHAIN = [f"{form}protochain {n}" for n in NEXT for form in ("ip ", "ip6 ", "")] + [
    "protochain 6 or protochain 17 or protochain 58",
    "ip6 protochain 6 and not ip6 protochain 17",
    "(ip6 protochain 17 or ip protochain 50) and len > 100",
]
LINKTYPES = ("EN10MB", "RAW", "LINUX_SLL2", "LINUX_SLL", "IPV6")
EXT = (0, 43, 44, 51, 60)   # hop-by-hop, routing, fragment, AH, destination options: what libpcap walks


def ext_header(kind: int, nh: int, rng: random.Random) -> bytes:
    """One IPv6 extension header (or an AH, for IPv4 too) of `kind` whose next header is nh."""
    if kind in (0, 60):    # options: PadN to the header's length
        total = 8 * (1 + rng.choice([0, 0, 1, 2, 5]))
        return bytes([nh, total // 8 - 1, 1, total - 4]) + bytes(total - 4)
    if kind == 43:         # routing: type 0, 2 (mobile IPv6) or 4 (segment routing), n addresses
        n = rng.choice([0, 1, 2, 3])
        return bytes([nh, 2 * n, rng.choice([0, 2, 4]), n]) + bytes(4) + bytes(range(16)) * n
    if kind == 44:         # fragment: first or later, more or last
        off = rng.choice([0, 0, 185, 8191])
        return bytes([nh, 0]) + struct.pack(">HI", off << 3 | rng.choice([0, 1]), rng.randrange(1 << 32))
    # AH: 12 bytes + ICV, length in 4-byte units minus 2
    icv = rng.choice([4, 12, 20])
    return struct.pack(">BBHII", nh, (12 + icv) // 4 - 2, 0, 0x1000, 7) + bytes(icv)


UPPER = {6: bytes.fromhex("3039005000000001000000005002200000000000"), 17: bytes.fromhex("303900350010abcd") +
         b"payload!", 58: bytes.fromhex("8000f00d12340001") + b"ping", 59: b"", 50: bytes(16), 47: bytes(8),
         253: bytes(12)}


def chain(rng: random.Random, kinds: list[int], last: int, v6: bool) -> bytes:
    """An IPv6 (or IPv4) packet whose headers after the fixed one are `kinds`, then protocol `last`."""
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.packet import Raw
    body = UPPER[last]
    nh = last
    for kind in reversed(kinds):
        body = ext_header(kind, nh, rng) + body
        nh = kind
    base = IPv6(src="2001:db8::1", dst="2001:db8::2", nh=nh) if v6 else IP(src="10.0.0.1", dst="10.0.0.2", proto=nh)
    return bytes(base / Raw(body))


def crafted_chains() -> list[tuple[bytes, int]]:
    """(packet, headers walked) for IPv6 chains of every walked kind, 0 to 20 long, ending in TCP, UDP, ICMPv6,
    no next header, ESP, GRE or an unassigned protocol; IPv4 packets behind chains of AH; truncated ones."""
    rng = random.Random(H.SEED)
    out = []
    for length in range(21):
        for last in UPPER:
            for _ in range(3 if length < 10 else 2):
                kinds = [rng.choice(EXT) for _ in range(length)]
                out.append((chain(rng, kinds, last, True), length))
            out.append((chain(rng, [51] * length, last, False), length))
    for kind in EXT:   # each kind alone and repeated, before each upper protocol
        for last in UPPER:
            out += [(chain(rng, [kind], last, True), 1), (chain(rng, [kind] * 16, last, True), 16),
                    (chain(rng, [kind] * 17, last, True), 17)]
    cut = []
    for pkt, n in rng.sample(out, 300):
        cut.append((pkt[: rng.randrange(len(pkt))], n))
    return out + cut


def frame(lt: str, ip: bytes) -> bytes | None:
    """The IP packet behind `lt`'s link header (None where the linktype cannot carry it)."""
    v6 = ip[:1] and ip[0] >> 4 == 6
    proto = b"\x86\xdd" if v6 else b"\x08\x00"
    if lt == "EN10MB":
        return bytes.fromhex("020000000002020000000001") + proto + ip
    if lt == "LINUX_SLL2":
        return proto + bytes(2) + struct.pack(">IHBB", 2, 1, 0, 6) + bytes.fromhex("020000000001") + bytes(2) + ip
    if lt == "LINUX_SLL":
        return struct.pack(">HHH", 0, 1, 6) + bytes.fromhex("0200000000010000") + proto + ip
    if lt == "IPV6":
        return ip if v6 else None
    return ip


def ip_of(lt: str, pkt: bytes) -> bytes | None:
    """The network-layer bytes of a corpus packet of linktype lt, when it carries IPv6 or IPv4 with AH."""
    head = {"EN10MB": 14, "LINUX_SLL": 16, "RAW": 0, "IPV6": 0}[lt]
    if lt == "EN10MB" and pkt[12:14] not in (b"\x86\xdd", b"\x08\x00"):
        return None
    if lt == "LINUX_SLL" and pkt[14:16] not in (b"\x86\xdd", b"\x08\x00"):
        return None
    ip = pkt[head:]
    if ip[:1] and (ip[0] >> 4 == 6 or (ip[0] >> 4 == 4 and len(ip) > 9 and ip[9] == 51)):
        return ip
    return None


class Walks:
    """Compiled protochain programs per linktype and the packets to run them on: the corpus's IPv6 (and IPv4
    AH) packets of each linktype as they are, and the crafted chains behind each linktype's header."""

    def __init__(self):
        self.progs: dict[str, dict[tuple, str]] = {}
        self.refused: list[tuple[str, str, str]] = []
        for lt in LINKTYPES:
            for e in PROTOCHAIN:
                try:
                    prog = tuple(H.compile_filter(lt, e).get_bpf())
                except Exception as ex:  # noqa: BLE001 - pcapy.PcapError: e.g. `ip protochain` on DLT_IPV6
                    self.refused.append((lt, e, str(ex)))
                    continue
                self.progs.setdefault(lt, {}).setdefault(prog, e)
        corpus = H.corpus_packets() if H.CAPTURES.exists() else {}
        self.corpus = {lt: [p for p in corpus.get(lt, []) if ip_of(lt, p) is not None] for lt in LINKTYPES}
        crafted = crafted_chains()
        self.crafted = {lt: [(f, n) for ip, n in crafted if (f := frame(lt, ip)) is not None] for lt in LINKTYPES}


@pytest.fixture(scope="module")
def walks():
    pytest.importorskip("pcapy")
    pytest.importorskip("scapy")
    pytest.importorskip("dpkt")
    return Walks()


_WALKS: dict = {}   # (program, packet) -> (jumps back, goes round in circles), shared by the harness modes


def _walk(prog: tuple, pkt: bytes) -> tuple[int, bool]:
    if (prog, pkt) not in _WALKS:
        walk: dict = {}
        H.run_cbpf(prog, pkt, bound=None, stats=walk)
        _WALKS[(prog, pkt)] = (walk.get("back", 0), walk.get("cycle", False))
    return _WALKS[(prog, pkt)]


def _verdict(g: int, prog: tuple, pkt: bytes, ref) -> str | None:
    """How the kernel's result g compares with libpcap's: "agree", "past_bound" (libpcap matches after a walk
    longer than LOOP_BOUND, fcap does not), "spin" (libpcap's AH step sets X to (len + 2) * 4 rather than adding
    it, so its walk can go round in circles: its bpf_filter would never return; fcap does not match), None: wrong.
    libpcap is asked only where its walk ends (no 0x33 = AH byte in the packet, or the reference says so)."""
    back, cycle = _walk(prog, pkt) if b"\x33" in pkt else (None, False)
    if cycle:
        return "spin" if g == 0 else None
    want = ref.filter(pkt)
    if g == want:
        return "agree"
    back = _walk(prog, pkt)[0] if back is None else back
    if back > cbpf.LOOP_BOUND and g == H.run_cbpf(prog, pkt) == 0:
        return "past_bound"
    return None


def _run_walks(walks: Walks, source: str, **kw) -> dict:
    """Every protochain program × every packet of its linktype from `source` ("corpus" or "crafted"): the kernel
    gives libpcap's verdict, except where libpcap's walk follows more than LOOP_BOUND headers or goes round in
    circles: there it gives fcap's documented one (no match)."""
    st = {"pairs": 0, "agree": 0, "past_bound": 0, "spin": 0, "packets": 0, "programs": 0, "matched": 0}
    bad = []
    for lt, progs in walks.progs.items():
        pkts = walks.corpus[lt] if source == "corpus" else [p for p, _ in walks.crafted[lt]]
        st["packets"] += len(pkts)
        st["programs"] += len(progs)
        refs = {p: H.compile_filter(lt, e) for p, e in progs.items()}
        for group, h in H.fitting(H.groups(list(progs)), **kw):
            try:
                for pkt in pkts:
                    _, got = h.run(pkt)
                    for prog, g in zip(group, got):
                        v = _verdict(g, prog, pkt, refs[prog])
                        st["pairs"] += 1
                        st["matched"] += g != 0
                        if v is not None:
                            st[v] += 1
                        elif len(bad) < 10:
                            bad.append(f"{lt} {progs[prog]!r}: kernel {g} libpcap {refs[prog].filter(pkt)} "
                                       f"walk {_walk(prog, pkt)} packet {pkt.hex()}")
            finally:
                h.close()
    assert not bad, "protochain disagrees with libpcap:\n" + "\n".join(bad)
    return st


def _report(what: str, st: dict, t0: float) -> None:
    print(f"\n{what}: {st['programs']} programs × {st['packets']} packets = {st['pairs']} pairs "
          f"({st['matched']} matches); {st['agree']} agree with libpcap; {st['past_bound']} match in libpcap "
          f"after a walk of more than {cbpf.LOOP_BOUND} headers and not in fcap (LOOP_BOUND); {st['spin']} make "
          f"libpcap's walk go round in circles (no match in fcap); {time.monotonic() - t0:.1f} s")


@kernel
@pytest.mark.parametrize("capacity, slow", [(4096, False), (96, True)])
def test_protochain_matches_libpcap_on_corpus_ipv6(walks, capacity, slow):
    if not H.CAPTURES.exists():
        pytest.skip(f"no tcpdump test captures at {H.CAPTURES}")
    t0 = time.monotonic()
    st = _run_walks(walks, "corpus", capacity=capacity, slow=slow)
    _report(f"protochain over the corpus's IPv6/AH packets (capacity {capacity}, slow_load {slow})", st, t0)
    assert st["past_bound"] == st["spin"] == 0 and st["agree"] == st["pairs"]
    assert st["packets"] >= 300, f"only {st['packets']} IPv6 packets in the corpus"


@kernel
@pytest.mark.parametrize("capacity, slow", [(4096, False), (96, True)])
def test_protochain_matches_libpcap_on_crafted_chains(walks, capacity, slow):
    t0 = time.monotonic()
    st = _run_walks(walks, "crafted", capacity=capacity, slow=slow)
    _report(f"protochain over crafted chains (capacity {capacity}, slow_load {slow})", st, t0)
    assert st["past_bound"] > 0, "no crafted chain is longer than LOOP_BOUND: the bound is not tested"


@kernel
@pytest.mark.parametrize("expr", ["ip6 protochain 0", "protochain 6 or protochain 17 or protochain 58"])
def test_loops_verify_in_linear_work(expr, monkeypatch):
    """The loop's back edge makes this kernel's verifier forget the ranges (a division it cannot follow, or an
    xor where it follows divisions: bpf.probes.division_ranges): the verifier then walks each loop LOOP_BOUND
    times, not a product of its states. (Linux 7.2 with the division: 94,000 instructions for 'ip6 protochain 0',
    a million for a batch; here a few thousand.)"""
    logs, plain = [], H.load

    def load(*a, **kw):
        p = plain(*a, **dict(kw, log_level=4))
        logs.append(p.log)
        return p
    monkeypatch.setattr(H, "load", load)
    prog = tuple(H.compile_filter("EN10MB", expr).get_bpf())
    for kw in ({"capacity": 4096, "slow": False}, {"capacity": 96, "slow": True}):
        H.Harness([prog], **kw).close()
        processed = int(logs[-1].rsplit("processed ", 1)[1].split()[0])
        assert processed < 40_000, f"{expr} {kw}: the verifier processed {processed} instructions"


def test_crafted_chains_are_what_libpcap_walks():
    """The crafted chains are well formed: libpcap's `ip6 protochain N` finds N after every chain without AH
    (libpcap's AH step sets X to (len + 2) * 4 instead of adding it: after an AH it reads the wrong bytes)."""
    pytest.importorskip("pcapy")
    pytest.importorskip("scapy")
    rng = random.Random(1)
    for length in (0, 1, 5, 16, 20):
        for last in (6, 17, 58, 253):
            ip = chain(rng, [rng.choice((0, 43, 44, 60)) for _ in range(length)], last, True)
            walk: dict = {}
            assert H.compile_filter("RAW", f"ip6 protochain {last}").filter(ip), (length, last, ip.hex())
            assert H.run_cbpf(H.compile_filter("RAW", f"ip6 protochain {last}").get_bpf(), ip, bound=None,
                              stats=walk) and walk.get("back", 0) == length


def test_loop_bound_in_the_reference():
    """A chain of LOOP_BOUND headers matches; one more does not (fcap's reference), libpcap matches both."""
    pytest.importorskip("pcapy")
    rng = random.Random(2)
    prog = H.compile_filter("RAW", "ip6 protochain 6")
    for n, want in ((cbpf.LOOP_BOUND, True), (cbpf.LOOP_BOUND + 1, False)):
        ip = chain(rng, [0] * n, 6, True)
        assert prog.filter(ip)
        assert bool(H.run_cbpf(prog.get_bpf(), ip)) == want


# ---- ancillary loads --------------------------------------------------------------------------------

AD = 0xFFFFF000
SKB_SIZE = 192          # sizeof(struct __sk_buff): the test run's context
LO_MAC = bytes(6)       # lo's address: the test run's skb is lo's
DSTS = {bytes(6): 0, bytes.fromhex("ffffffffffff"): 2, bytes.fromhex("01005e000001"): 2,
        bytes.fromhex("020000000001"): 3}   # on lo (broadcast address 0): host, multicast, multicast, other host
TYPES = [0x0800, 0x86DD, 0x0806, 0x88CC, 0x0010]


def protocol_of(ethertype: int, pkt: bytes) -> int:
    """skb->protocol as eth_type_trans sets it: the type, or ETH_P_802_3 / ETH_P_802_2 for a length."""
    if ethertype >= 0x600:
        return ethertype
    return 0x0001 if pkt[:2] == b"\xff\xff" else 0x0004


def ancillary_programs() -> list[tuple[str, tuple]]:
    """(name, program): each field alone (`ld{,h,b} [SKF_AD_OFF + n]; ret a`: the value itself), with X live
    across the load, SKF_AD_ALU_XOR_X, and libpcap's inbound/outbound."""
    out = []
    for f in sorted(set(H.SKB_AD) | {36}):
        for size in (0x00, 0x08, 0x10):
            out.append((f"{cbpf.ANCILLARY[f]}/{size:#x}", ((0x20 | size, 0, 0, AD + f), (0x16, 0, 0, 0))))
        out.append((f"{cbpf.ANCILLARY[f]}+x", ((0x01, 0, 0, 0x1000), (0x20, 0, 0, AD + f), (0x0C, 0, 0, 0),
                                               (0x16, 0, 0, 0))))
    out.append(("xor", ((0x00, 0, 0, 0x1234), (0x01, 0, 0, 0xFF0F), (0x20, 0, 0, AD + 40), (0x16, 0, 0, 0))))
    out.append(("pkttype == outgoing ? x : 0", ((0x01, 0, 0, 77), (0x28, 0, 0, AD + 4), (0x15, 0, 1, 4),
                                                (0x87, 0, 0, 0), (0x16, 0, 0, 0))))
    for lt in ("EN10MB", "RAW"):
        for e in ("inbound", "outbound", "inbound and ip6", "outbound or ip"):
            out.append((f"{lt} {e}", tuple(H.compile_filter(lt, e).get_bpf())))
    return out


@kernel
def test_ancillary_loads_read_the_skb():
    """Each program in one SCHED_CLS harness whose model reads __sk_buff (mark from the test run's context,
    protocol and pkt_type from the Ethernet header it parses, ifindex 1 (lo), queue, hash and VLAN 0, the CPU
    this process is pinned to): the value each returns equals the reference interpreter's with those fields."""
    pytest.importorskip("pcapy")
    progs = ancillary_programs()
    h = H.Harness([p for _, p in progs], ancillary=True)
    rng = random.Random(H.SEED)
    cpus = sorted(os.sched_getaffinity(0))
    pairs = 0
    try:
        for cpu in cpus[:2]:
            os.sched_setaffinity(0, {cpu})
            for dst, pkttype in DSTS.items():
                for et in TYPES:
                    for mark in (0, 5, 0xDEADBEEF):
                        # (≥ 40 bytes: a test run refuses an IPv6 skb shorter than an IPv6 header)
                        pkt = rng.choice([bytes(40), b"\xff\xff" + bytes(48), bytes(range(60))])
                        ctx = bytearray(SKB_SIZE)
                        struct.pack_into("<I", ctx, 8, mark)
                        _, got = h.run(pkt, dst + bytes.fromhex("020000000009") + struct.pack(">H", et), bytes(ctx))
                        aux = {0: protocol_of(et, pkt), 4: pkttype, 8: 1, 12: mark, 16: 0, 32: 0, 36: cpu, 44: 0,
                               48: 0, 60: 0}
                        want = [H.run_cbpf(p, pkt, aux=aux) for _, p in progs]
                        bad = [(n, g, w) for (n, _), g, w in zip(progs, got, want) if g != w]
                        assert not bad, f"cpu {cpu} dst {dst.hex()} type {et:#x} mark {mark:#x}: {bad}"
                        pairs += len(progs)
    finally:
        os.sched_setaffinity(0, set(cpus))
        h.close()
    print(f"\nancillary loads: {len(progs)} programs × {pairs // len(progs)} skbs = {pairs} pairs agree")


@kernel
def test_random_ancillary_varies():
    h = H.Harness([((0x20, 0, 0, AD + 56), (0x16, 0, 0, 0))], ancillary=True)
    try:
        seen = {h.run(bytes(20))[0] for _ in range(32)}
    finally:
        h.close()
    assert len(seen) > 16, seen


def test_without_a_model_ancillary_loads_are_refused_in_one_line():
    from bpf.asm import R6, R7, R8
    for f, name in cbpf.ANCILLARY.items():
        if f == 40:
            continue
        with pytest.raises(cbpf.CBPFError, match=f"instruction 0: Linux ancillary field {name} "):
            cbpf.translate([(0x20, 0, 0, AD + f), (0x16, 0, 0, 0)], cbpf.PacketModel(R6, R7, R8, 64))
