"""cBPF→eBPF translation: pure checks against a reference interpreter, and kernel runs against libpcap's verdicts."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bpf import asm, cbpf
from bpf.asm import R0, R6, R7, R8, R9
from bpf.cbpf import CBPFError, PacketModel, translate

import cbpf_harness as H

MODEL = PacketModel(buf=R6, buflen=R7, wirelen=R8, capacity=256)
RET_ACCEPT = (0x06, 0, 0, 262144)


def _insns(items):
    return [it for it in items if isinstance(it, asm.Insn)]


# ---- the reference interpreter against libpcap -------------------------------------------------

REF_EXPRS = ["tcp port 80", "len >= 100", "ip[2:2] % (ip[9] + 1) = 0", "ether[0] << ether[1] = 0",
             "ip[0] >> ip[9] = 0", "ip[2:2] / (ip[8] - 64) > 1", "-ip[8] & 0xff = 0xc0", "ip[9] * ip[8] > 1000",
             "ether[ether[13] + 20] > 0x10", "tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x47455420", "vlan 100",
             "ip6 protochain 6", "ether[0:4] > 0x80000000", "ether[0] - ether[1] > 0x80000000",
             "ip[3] | ip[2] ^ ip[1] != 0", "len * 3 - 7 > 200"]


def test_reference_interpreter_matches_libpcap():
    pytest.importorskip("pcapy")
    pytest.importorskip("scapy")
    rng = random.Random(H.SEED)
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Dot1Q, Ether
    pkts = [bytes(Ether() / IP(ttl=t, proto=p) / TCP(dport=80) / b"GET /") for t in (1, 64, 65) for p in (6, 17)]
    pkts += [bytes(Ether() / Dot1Q(vlan=100) / IP() / UDP()), b"", b"\xff" * 13, bytes(range(256)) * 3]
    pkts += [bytes(rng.randrange(256) for _ in range(rng.randrange(120))) for _ in range(200)]
    n = 0
    for e in REF_EXPRS:
        p = H.compile_filter("EN10MB", e)
        prog = p.get_bpf()
        for pkt in pkts:
            assert H.run_cbpf(prog, pkt) == p.filter(pkt), (e, pkt.hex())
            n += 1
    assert n == len(REF_EXPRS) * len(pkts) > 0
    print(f"reference interpreter: {n} (expression, packet) pairs agree with libpcap")


# ---- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("prog, why", [
    ([], "empty"),
    ([(0x06 | 0x08, 0, 0, 0)], "invalid opcode 0xe"),
    ([(0xFF, 0, 0, 0), RET_ACCEPT], "opcode"),
    ([(0x28, 0, 0, 12)], "last instruction"),
    ([(0x15, 5, 0, 1), RET_ACCEPT], "past the end"),
    ([(0x15, 0, 1, 1), RET_ACCEPT], "past the end"),
    ([(0x05, 0, 0, 1), RET_ACCEPT], "past the end"),
    ([RET_ACCEPT, (0x05, 0, 0, -3), RET_ACCEPT], "before the start"),
    ([(0x34, 0, 0, 0), RET_ACCEPT], "division by constant 0"),
    ([(0x94, 0, 0, 0), RET_ACCEPT], "division by constant 0"),
    ([(0x64, 0, 0, 32), RET_ACCEPT], "shift"),
    ([(0x02, 0, 0, 16), RET_ACCEPT], "scratch memory"),
    ([(0x60, 0, 0, 99), RET_ACCEPT], "scratch memory"),
    ([(0x30, 0, 0, 0xFFFFF000), RET_ACCEPT], "ancillary field protocol .* no socket buffer"),   # no model
    ([(0x20, 0, 0, -4096 + 3), RET_ACCEPT], "unknown Linux ancillary field SKF_AD_OFF [+] 3"),
    ([(0x20, 0, 0, -0x100000), RET_ACCEPT], "unsupported"),    # SKF_NET_OFF
    ([(0x50, 0, 0, -0x200000), RET_ACCEPT], "unsupported"),    # SKF_LL_OFF
    ([(0xB1, 0, 0, -4096), RET_ACCEPT], "unsupported"),
    ([(0x15, 256, 0, 1), RET_ACCEPT], "0..255"),
    ([(0x06, 0, 0, 1 << 32)], "32-bit"),
    ([(0x06, 0, 0)], "tuple"),
])
def test_invalid_programs_raise(prog, why):
    with pytest.raises(CBPFError, match=why):
        translate(prog, MODEL)


def test_bad_model_is_a_value_error():
    with pytest.raises(ValueError):
        translate([RET_ACCEPT], PacketModel(R0, R7, R8, 256))
    with pytest.raises(ValueError):
        translate([RET_ACCEPT], PacketModel(R6, R7, R8, 0))
    with pytest.raises(ValueError):
        translate([RET_ACCEPT], MODEL, stack_off=-60)


_codes = st.sampled_from(sorted(cbpf._VALID) + [0x07 | 0x40, 0x0E, 0x61 | 0x08, 0x04 | 0x80 | 0x08, 0xFF])
_tuples = st.tuples(st.one_of(_codes, st.integers(0, 0xFFFF)), st.integers(0, 300), st.integers(0, 300),
                    st.one_of(st.integers(-(1 << 31), (1 << 32) - 1), st.integers(0, 40),
                              st.sampled_from([0xFFFFF000, 0x80000000, 0xFFFFFFFF])))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_tuples, max_size=12), st.booleans())
def test_random_tuples_raise_only_cbpf_error(prog, slow):
    model = PacketModel(R6, R7, R8, 64, (lambda size, off, dst, rej: [asm.movi(dst, 0)]) if slow else None)
    try:
        items = translate(prog, model)
    except CBPFError:
        return
    # every jump lands on a label; only an unconditional jump goes back (a loop's, after its counter's check)
    for ins in asm.resolve(items + [asm.label("cbpf_done")]):
        if ins.op & 7 in (asm.JMP, asm.JMP32) and ins.op & 0xF0 not in (asm.CALL, asm.EXIT):
            assert ins.off >= 0 or ins.op == asm.JMP | asm.JA


# ---- shape ---------------------------------------------------------------------------------------

def test_shape_prefix_result_and_two_translations_share_a_program():
    prog = [(0x28, 0, 0, 12), (0x15, 0, 1, 0x800), RET_ACCEPT, (0x06, 0, 0, 0)]
    a = translate(prog, MODEL, prefix="one", done="end", result=R9)
    b = translate(prog, MODEL, prefix="two", done="end2", result=R9)
    labels = [it.name for it in a + b if isinstance(it, asm.Label)]
    assert labels and all(n.startswith(("one_", "two_")) for n in labels)
    asm.resolve(a + [asm.label("end")] + b + [asm.label("end2")])
    # RET writes the result register with a 32-bit move (zero-extended)
    assert any(i.op == asm.ALU | asm.MOV | asm.K and i.dst == R9 and i.imm == 262144 for i in _insns(a))
    assert not any(isinstance(it, asm.Insn) and it.target == "cbpf_done" for it in a)


def test_ret_k_above_2_31_is_zero_extended():
    items = _insns(translate([(0x06, 0, 0, 0xFFFFFFFF)], MODEL))
    assert items == [asm.alu32(asm.MOV, R0, 0xFFFFFFFF)]


def test_unreachable_code_is_dropped():
    prog = [(0x05, 0, 0, 2), (0x00, 0, 0, 7), (0x06, 0, 0, 5), (0x28, 0, 0, 12), (0x16, 0, 0, 0)]
    ins = _insns(translate(prog, MODEL))
    assert not any(i.imm in (7, 5) for i in ins if i.op & 7 == asm.ALU)


def test_scratch_memory_zeroed_only_when_read_before_written():
    written_first = [(0x00, 0, 0, 1), (0x02, 0, 0, 3), (0x60, 0, 0, 3), (0x16, 0, 0, 0)]
    read_first = [(0x60, 0, 0, 3), (0x16, 0, 0, 0)]
    zero_stores = lambda items: [i for i in _insns(items) if i.op == asm.ST | asm.MEM | asm.W]  # noqa: E731
    assert zero_stores(translate(written_first, MODEL)) == []
    assert zero_stores(translate(read_first, MODEL, stack_off=-128)) == [asm.st(asm.W, asm.FP, -128 + 12, 0)]


def test_guards_are_hoisted():
    """tcp port 80: the length checks of its 6 constant-offset loads are combined into 3 guards."""
    pytest.importorskip("pcapy")
    prog = H.compile_filter("EN10MB", "tcp port 80").get_bpf()
    ins = _insns(translate(prog, MODEL))
    guards = [i for i in ins if i.op == asm.JMP | asm.JLT | asm.K and i.dst == MODEL.buflen]
    assert len(guards) == 3
    assert len(ins) <= 2.5 * len(prog)


def test_loads_compared_with_constants_skip_the_byte_swap():
    """ldh [12]; jeq #0x800: no byte swap, the constant is swapped (0x0008); a JGT keeps the swap."""
    eq = _insns(translate([(0x28, 0, 0, 12), (0x15, 0, 1, 0x800), RET_ACCEPT, (0x06, 0, 0, 0)], MODEL))
    assert not any(i.op & 0xF7 == asm.ALU | asm.END for i in eq)
    assert any(i.op == asm.JMP32 | asm.JNE | asm.K and i.imm == 0x0008 for i in eq)
    gt = _insns(translate([(0x28, 0, 0, 12), (0x25, 0, 1, 0x800), RET_ACCEPT, (0x06, 0, 0, 0)], MODEL))
    assert any(i.op & 0xF7 == asm.ALU | asm.END for i in gt)
    # two loads reaching one compare: both raw or both swapped, never mixed
    mixed = [(0x28, 0, 0, 12), (0x15, 0, 1, 1), (0x28, 0, 0, 14), (0x25, 0, 1, 3), RET_ACCEPT, (0x06, 0, 0, 0)]
    assert sum(i.op & 0xF7 == asm.ALU | asm.END for i in _insns(translate(mixed, MODEL))) == 2


def test_disassemble_like_tcpdump_d():
    prog = [(0x28, 0, 0, 12), (0x15, 0, 6, 0x86DD), (0xB1, 0, 0, 14), (0x48, 0, 0, 16), (0x54, 0, 0, 0xF0),
            (0x87, 0, 0, 0), (0x16, 0, 0, 0), (0x06, 0, 0, 262144), RET_ACCEPT]
    assert cbpf.disassemble(prog).splitlines() == [
        "(000) ldh      [12]", "(001) jeq      #0x86dd          jt 2\tjf 8", "(002) ldxb     4*([14]&0xf)",
        "(003) ldh      [x + 16]", "(004) and      #0xf0", "(005) txa", "(006) ret      a", "(007) ret      #262144",
        "(008) ret      #262144"]


def test_loads_past_capacity_without_slow_load_reject_statically():
    ins = _insns(translate([(0x28, 0, 0, 300), (0x16, 0, 0, 0)], MODEL))
    assert ins == [asm.alu32(asm.MOV, R0, 0)]


def test_slow_load_keeps_x_across_the_call():
    calls = []

    def slow(size, off, dst, reject):
        calls.append((size, off, dst, reject))
        return [asm.movi(dst, 0)]
    prog = [(0x01, 0, 0, 9), (0x28, 0, 0, 300), (0x0C, 0, 0, 0), (0x16, 0, 0, 0)]   # X = 9; A = P[300:2]; A += X
    ins = _insns(translate(prog, PacketModel(R6, R7, R8, 256, slow), stack_off=-64))
    assert calls == [(2, asm.R2, R0, "cbpf_reject")]
    spill = [i for i in ins if i.op == asm.STX | asm.MEM | asm.W and i.src == asm.R1]
    assert spill and spill[0].off == -64   # M[0]: the first scratch word the program does not use


# ---- kernel --------------------------------------------------------------------------------------

KERNEL = H.kernel_reason()
kernel = pytest.mark.skipif(KERNEL is not None, reason=f"kernel tests: {KERNEL}")


class Corpus:
    """Compiled filters (linktype, expression, optimize, program) and packets per linktype."""

    def __init__(self):
        import pcapy  # noqa: F401
        self.skipped: dict[str, int] = {}
        self.filters: list[tuple[str, str, int, tuple]] = []
        rows = [(lt, e, 1) for lt, e in H.corpus_filters() if lt in H.DLT]
        self.corpus_rows = len(rows)
        rows += [("EN10MB", e, 1) for e in H.OWN_EN10MB] + [("RAW", e, 1) for e in H.OWN_RAW]
        rows += [("EN10MB", e, 0) for e in H.OWN_EN10MB]   # unoptimized: redundant jumps, unreachable blocks
        rows += [(lt, e, 0) for lt, e in H.corpus_filters() if lt in ("EN10MB", "RAW")]
        for lt, e, opt in rows:
            if "libpcap.test" in e.lower():  # names only libpcap's test setup resolves: no DNS from tests
                self.skipped["host name of libpcap's test setup"] = self.skipped.get(
                    "host name of libpcap's test setup", 0) + 1
                continue
            try:
                prog = tuple(H.compile_filter(lt, e, opt).get_bpf())
            except Exception as ex:  # noqa: BLE001 - pcapy.PcapError and friends
                why = str(ex).split(":")[0][:40]
                self.skipped[why] = self.skipped.get(why, 0) + 1
                continue
            try:
                cbpf.validate(prog)
            except CBPFError as ex:
                why = "translate: " + str(ex).split(": ", 1)[1].split(" (")[0]
                self.skipped[why] = self.skipped.get(why, 0) + 1
                continue
            if any(cbpf.ancillary_field(c, k & 0xFFFFFFFF) is not None for c, _, _, k in prog):
                why = "Linux ancillary loads (libpcap's bpf_filter cannot run them: test_cbpf_ext.py)"
                self.skipped[why] = self.skipped.get(why, 0) + 1
                continue
            self.filters.append((lt, e, opt, prog))
        exprs: dict[str, list[str]] = {}
        for lt, e, _, _ in self.filters:
            exprs.setdefault(lt, []).append(e)
        self.packets = H.build_packets(H.corpus_packets(), exprs)
        self._pcap = {}

    def libpcap(self, lt: str, expr: str, opt: int):
        key = (lt, expr, opt)
        if key not in self._pcap:
            self._pcap[key] = H.compile_filter(lt, expr, opt)
        return self._pcap[key]


@pytest.fixture(scope="module")
def corpus():
    pytest.importorskip("pcapy")
    pytest.importorskip("dpkt")
    pytest.importorskip("scapy")
    if not H.FILTERS_TSV.exists():
        pytest.skip(f"no filter corpus at {H.FILTERS_TSV}")
    return Corpus()


GUEST_STRIDE = H.GUEST_STRIDE   # (every translated program still goes through a guest kernel's verifier and runs)


def _differential(corpus: Corpus, capacity: int, slow: bool, stride: int = 1) -> dict:
    """Every distinct compiled program × every (stride-th) packet of its linktype: the kernel's result (each
    translated program inside a batch harness) must equal libpcap's BPFProgram.filter, value for value."""
    stats = {"pairs": 0, "programs": 0, "expressions": 0, "cbpf": 0, "ebpf": 0, "linktypes": {}}
    failures = []
    by_lt: dict[str, dict[tuple, tuple]] = {}
    for lt, e, opt, prog in corpus.filters:
        by_lt.setdefault(lt, {}).setdefault(prog, (e, opt))
        stats["expressions"] += 1
    for lt, progs in sorted(by_lt.items()):
        pkts = corpus.packets[lt][::stride * GUEST_STRIDE]
        stats["linktypes"][lt] = (len(progs), len(pkts))
        for group, h in H.fitting(H.groups(list(progs)), capacity=capacity, slow=slow):
            try:
                stats["programs"] += len(group)
                stats["cbpf"] += sum(len(p) for p in group)
                stats["ebpf"] += sum(h.per_filter)
                refs = [corpus.libpcap(lt, *progs[p]) for p in group]
                for pkt in pkts:
                    _, got = h.run(pkt)
                    want = [r.filter(pkt) for r in refs]
                    stats["pairs"] += len(group)
                    if got != want:
                        for p, g, w in zip(group, got, want):
                            if g != w and len(failures) < 20:
                                failures.append(f"{lt} {progs[p][0]!r} (optimize={progs[p][1]}): kernel {g} "
                                                f"libpcap {w} packet {pkt.hex()}")
            finally:
                h.close()
    if failures:
        pytest.fail("translated filters disagree with libpcap:\n" + "\n".join(failures))
    assert stats["programs"] > 0 and stats["pairs"] > 0, f"no program ran on a packet: {stats}"
    return stats


def _report(name: str, stats: dict, t0: float) -> None:
    print(f"\n{name}: {stats['pairs']} (program, packet) pairs agree with libpcap; "
          f"{stats['expressions']} expressions = {stats['programs']} distinct programs; "
          f"eBPF/cBPF instructions {stats['ebpf']}/{stats['cbpf']} = {stats['ebpf'] / max(1, stats['cbpf']):.2f}; "
          f"{time.monotonic() - t0:.1f} s")
    for lt, (np_, npk) in stats["linktypes"].items():
        print(f"  {lt}: {np_} programs × {npk} packets")


@kernel
def test_kernel_matches_libpcap_on_corpus(corpus):
    t0 = time.monotonic()
    stats = _differential(corpus, capacity=4096, slow=False)
    print(f"\nfilters skipped (pcapy's libpcap refuses them, or they need what the translation refuses): "
          f"{sum(corpus.skipped.values())} "
          f"{dict(sorted(corpus.skipped.items(), key=lambda kv: -kv[1]))}")
    _report("buffer holds the whole packet", stats, t0)
    assert stats["programs"] >= 200 and len(corpus.packets["EN10MB"]) >= 1000


@kernel
def test_kernel_matches_libpcap_with_slow_loads(corpus):
    """A 96-byte buffer: every load past it goes through slow_load (bpf_skb_load_bytes)."""
    t0 = time.monotonic()
    stats = _differential(corpus, capacity=96, slow=True, stride=2)
    _report("96-byte buffer + slow_load", stats, t0)
    assert stats["programs"] >= 200, stats  # the same filters as the test above: no fewer ran


@kernel
def test_one_program_per_expression_returns_the_verdict(corpus):
    """The harness's own return value (the last filter's result), one program per expression."""
    rng = random.Random(H.SEED)
    t0 = time.monotonic()
    pairs = 0
    cache: dict[tuple, H.Harness] = {}
    per = 40 // GUEST_STRIDE + 1  # packets per expression
    try:
        for lt, e, opt, prog in corpus.filters:
            if opt == 0 or lt not in ("EN10MB", "RAW"):
                continue
            if prog not in cache:
                cache[prog] = H.Harness([prog], capacity=1536)
            ref = corpus.libpcap(lt, e, opt)
            for pkt in rng.sample(corpus.packets[lt], per):
                retval, _ = cache[prog].run(pkt)
                want = ref.filter(pkt)
                assert retval == want, f"{lt} {e!r}: kernel {retval} libpcap {want} packet {pkt.hex()}"
                pairs += 1
    finally:
        for h in cache.values():
            h.close()
    assert len(cache) >= 100 and pairs >= per * len(cache), (len(cache), pairs)
    print(f"\none program per expression: {len(cache)} programs, {pairs} pairs, {time.monotonic() - t0:.1f} s")


# random valid cBPF programs: every opcode, checked against the reference interpreter

def _random_program(rng: random.Random, loops: bool = False) -> list[tuple[int, int, int, int]]:
    n = rng.randrange(2, 30)
    ks = [0, 1, 2, 3, 4, 12, 13, 14, 20, 23, 31, 60, 63, 64, 95, 96, 97, 200, 255, 0x7FFFFFFF, 0x80000000,
          0xFFFFFFFF, 0xFFFF, 0x4545, 0x45454545, 0x0101, 0x01010101, 0x10000, 0x00FF, 0xFF00, 0x45,
          0x12345678, 0x78123456, 0x1234, 0x5678, 0x3456, 0x000000FF, 0xFF000000]
    prog = []
    while len(prog) < n - 1:
        i = len(prog)
        k = rng.choice(ks) if rng.random() < 0.7 else rng.randrange(1 << 32)
        kind = rng.randrange(10)
        left = n - 2 - i
        if kind == 0:
            code = rng.choice([0x20, 0x28, 0x30, 0x40, 0x48, 0x50, 0xB1])
            k = rng.choice([0, 1, 2, 12, 14, 20, 40, 60, 90, 94, 95, 96, 100, 150, 250, 1000, 0x7FFFFFF0])
            if left > 0 and rng.random() < 0.5:   # a load compared with a constant: the byte-swap-free path
                prog.append((code, 0, 0, k))
                k, left = rng.choice(ks), left - 1
                code = rng.choice([0x15, 0x45])
                prog.append((code, rng.randrange(min(left, 255) + 1), rng.randrange(min(left, 255) + 1), k))
                continue
        elif kind == 1:
            code = rng.choice([0x00, 0x01, 0x80, 0x81, 0x07, 0x87])
        elif kind == 2:
            code, k = rng.choice([0x02, 0x03, 0x60, 0x61]), rng.randrange(16)
        elif kind in (3, 4, 5):
            op = rng.choice(list(cbpf._ALU_OPS))
            code = 0x04 | op | (0x08 if rng.random() < 0.5 and op != 0x80 else 0)
            if code & 8 == 0 and op in (0x30, 0x90) and k == 0:
                k = 3
            if code & 8 == 0 and op in (0x60, 0x70):
                k %= 32
        elif kind in (6, 7, 8):
            code = rng.choice([0x15, 0x1D, 0x25, 0x2D, 0x35, 0x3D, 0x45, 0x4D])
            prog.append((code, rng.randrange(min(left, 255) + 1), rng.randrange(min(left, 255) + 1), k))
            continue
        elif loops and i and rng.random() < 0.5:   # a jump back to one of the instructions so far (one loop:
            code, k = 0x05, (rng.randrange(i + 1) - (i + 1)) & 0xFFFFFFFF   # nested ones cost the verifier
            loops = False                                                  # LOOP_BOUND^depth walks)
        else:
            code, k = (0x05, rng.randrange(left + 1)) if rng.random() < 0.5 else (rng.choice([0x06, 0x16]), k)
        prog.append((code, 0, 0, k))
    prog.append((rng.choice([0x06, 0x16]), 0, 0, rng.choice([0, 1, 0xFFFFFFFF, 262144])))
    return prog


def _filter_like_program(rng: random.Random, template: bytes) -> list[tuple[int, int, int, int]]:
    """libpcap-shaped: blocks of `load; compare with a constant taken from a template packet` that fall
    through on a match and go to `ret #0` otherwise, then `ret #accept`: loads compared only with constants."""
    prog: list[tuple[int, int, int, int]] = []
    for _ in range(rng.randrange(1, 6)):
        size = rng.choice([1, 2, 4])
        ind = rng.random() < 0.3
        off = rng.randrange(0, 140)
        if ind:
            prog.append((0xB1, 0, 0, rng.choice([0, 14, 20])))
        code = {1: 0x10, 2: 0x08, 4: 0x00}[size] | (0x40 if ind else 0x20)
        prog.append((code, 0, 0, off))
        k = int.from_bytes(template[off: off + size], "big") if off + size <= len(template) and not ind \
            else rng.randrange(1 << (8 * size))
        op = rng.choice([0x15, 0x15, 0x45, 0x25])
        prog.append((op, 0, 0, k))   # jf patched below to reach the final `ret #0`
    prog += [RET_ACCEPT, (0x06, 0, 0, 0)]
    n = len(prog)
    return [(c, jt, n - 2 - i if c in (0x15, 0x45, 0x25) else jf, k) for i, (c, jt, jf, k) in enumerate(prog)]


@kernel
@pytest.mark.parametrize("capacity, slow", [(4096, False), (96, True), (96, False)])
def test_random_programs_match_reference(capacity, slow):
    """Random valid programs (all opcodes: DIV/MOD/shift by X, TAX/TXA, M[], IND, MSH, RET A) on random packets.
    Without slow_load a buffer of `capacity` bytes means libpcap's semantics on the packet cut to capacity."""
    rng = random.Random(H.SEED + capacity + slow)
    progs = [tuple(_random_program(rng)) for _ in range(300)]
    pkts = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 13, 14, 20, 60, 95, 96, 97, 98, 150, 300,
                                                               rng.randrange(400)])))
            for _ in range(60)]
    pkts += [bytes([rng.choice([0, 1, 0x45, 0xFF])]) * rng.randrange(200) for _ in range(20)]
    pkts += [bytes.fromhex(rng.choice(["12345678", "000000ff", "ff000000", "5678"])) * rng.randrange(80)
             for _ in range(20)]
    progs += [tuple(_filter_like_program(rng, rng.choice(pkts))) for _ in range(200)]
    pairs = 0
    failures = []
    for group, h in H.fitting(H.groups(progs, max_progs=50), capacity=capacity, slow=slow):
        try:
            for pkt in pkts:
                _, got = h.run(pkt)
                seen = pkt if slow else pkt[:capacity]
                want = [H.run_cbpf(p, seen, len(pkt)) for p in group]
                pairs += len(group)
                for p, g, w in zip(group, got, want):
                    if g != w and len(failures) < 10:
                        failures.append(f"kernel {g} reference {w}\n  program {list(p)}\n  packet {pkt.hex()}")
        finally:
            h.close()
    assert not failures, "\n".join(failures)
    assert pairs == len(progs) * len(pkts), pairs  # every program ran on every packet
    print(f"\nrandom programs (capacity {capacity}, slow_load {slow}): {pairs} pairs agree")


@kernel
@pytest.mark.parametrize("capacity, slow", [(4096, False), (96, True)])
def test_random_programs_with_loops_match_reference(capacity, slow):
    """Random valid programs with jumps back (loops, nested, endless) against the reference interpreter with
    fcap's bound: the (LOOP_BOUND + 1)-th jump back to one instruction returns 0."""
    rng = random.Random(H.SEED + 7 + capacity)
    progs = [p for p in (tuple(_random_program(rng, loops=True)) for _ in range(400))
             if any(c == 0x05 and k >= 1 << 31 for c, _, _, k in p)][:150]
    pkts = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 14, 60, 97, 150, 300]))) for _ in range(40)]
    pairs, loops_run = 0, 0
    failures = []
    for group, h in H.fitting(H.groups(progs, max_progs=20), capacity=capacity, slow=slow):
        try:
            for pkt in pkts:
                _, got = h.run(pkt)
                seen = pkt if slow else pkt[:capacity]
                for p, g in zip(group, got):
                    walk: dict = {}
                    w = H.run_cbpf(p, seen, len(pkt), stats=walk)
                    pairs += 1
                    loops_run += walk.get("back", 0) > 0
                    if g != w and len(failures) < 10:
                        failures.append(f"kernel {g} reference {w}\n  program {list(p)}\n  packet {pkt.hex()}")
        finally:
            h.close()
    assert not failures, "\n".join(failures)
    assert len(progs) >= 100 and loops_run > pairs // 10
    print(f"\nrandom programs with loops (capacity {capacity}, slow_load {slow}): {len(progs)} programs, {pairs} "
          f"pairs agree ({loops_run} jumped back)")


@kernel
def test_capacity_limit_and_slow_load():
    """A 300-byte packet, a 64-byte buffer, a load at 200: through slow_load when given, rejected without it."""
    prog = [(0x30, 0, 0, 200), (0x15, 0, 1, 0xAB), (0x06, 0, 0, 1), (0x06, 0, 0, 2)]   # P[200] == 0xab ? 1 : 2
    ind = [(0x01, 0, 0, 150), (0x48, 0, 0, 50), (0x16, 0, 0, 0)]                      # A = P[X + 50:2]
    msh = [(0xB1, 0, 0, 100), (0x87, 0, 0, 0), (0x16, 0, 0, 0)]                       # A = 4 * (P[100] & 15)
    pkt = bytearray(300)
    pkt[200], pkt[201] = 0xAB, 0xCD
    pkt[100] = 0x47
    for prg, want in ((prog, 1), (ind, 0xABCD), (msh, 28)):
        fast = H.Harness([prg], capacity=64)
        slow = H.Harness([prg], capacity=64, slow=True)
        try:
            assert slow.run(bytes(pkt))[0] == want
            assert fast.run(bytes(pkt))[0] == 0
            assert slow.run(bytes(pkt[:100]))[0] == 0   # past the packet's end: 0, as libpcap
        finally:
            fast.close()
            slow.close()


@kernel
def test_big_capacity_and_all_scratch_words():
    """A 64 KiB buffer (load offsets past the 16-bit instruction offset) and a program using all 16 M[] words
    with a slow load in the middle (X is spilled below M)."""
    prog = [(0x30, 0, 0, 40000), (0x16, 0, 0, 0)]
    ind = [(0x01, 0, 0, 39990), (0x50, 0, 0, 20), (0x16, 0, 0, 0)]
    small = [(0x30, 0, 0, 100), (0x16, 0, 0, 0)]
    h = H.Harness([prog, ind, small], capacity=65536)
    try:
        assert h.run(bytes(range(200)))[1] == [0, 0, 100]
    finally:
        h.close()
    words = []
    for j in range(16):
        words += [(0x00, 0, 0, 100 + j), (0x02, 0, 0, j)]
    words += [(0x01, 0, 0, 3), (0x30, 0, 0, 150), (0x0C, 0, 0, 0)]       # X = 3; A = P[150]; A += X
    for j in range(16):
        words += [(0x61, 0, 0, j), (0x0C, 0, 0, 0)]                      # A += M[j]
    words += [(0x16, 0, 0, 0)]
    pkt = bytes(range(200))
    want = H.run_cbpf(words, pkt)
    assert want == 150 + 3 + sum(100 + j for j in range(16))
    h = H.Harness([words], capacity=64, slow=True)
    try:
        assert h.run(pkt)[0] == want
    finally:
        h.close()
    ins = _insns(translate(words, PacketModel(R6, R7, R8, 64, H.skb_slow_load(0, -8)), stack_off=-80))
    assert any(i.op == asm.STX | asm.MEM | asm.W and i.off == -88 for i in ins)
