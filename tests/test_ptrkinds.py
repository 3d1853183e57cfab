"""Pure tests of bpf.ptrkinds (one pointer kind per load and store on every path, checked before a program loads):
the mix 6.18.44 refused, spills and fills, loops, context rules, stores, Holds in bpf.asm, and bpf.prog.load."""

from __future__ import annotations

import pytest

from bpf import asm, prog, ptrkinds
from bpf.asm import (ADD, B, DW, FP, JEQ, JNE, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, SUB, W, call, exit_, holds,
                     ja, jmp, label, ld_map_fd, ld_map_value, ldx, mov, movi, st, stx)
from bpf.errors import AsmError, BPFError, PointerKindError
from bpf.ptrkinds import Kind, check, ctx_rule, register_kinds
from bpf.uapi import Helper, ProgType

import bpfprogs
import cbpf_harness as HARNESS

SKB_HEAD = 200    # where a struct sk_buff might keep `head` (any offset will do here)
TRACING = ProgType.TRACING


def _mixed_filter(*, split: bool = False) -> list:
    """What fcap's filter did: R6 = the skb's bytes in place (skb->head: untrusted memory) or a copy (a map value),
    one load of the packet's byte 12 for both. split: that load once per path."""
    items = [ldx(DW, R6, R1, 0),                               # the skb (tp_btf argument 0)
             ld_map_value(R7, 3),
             movi(R0, 0), jmp(JEQ, R0, 0, "copy"),
             ldx(DW, R1, R6, SKB_HEAD), holds(R1, "mem_untrusted"), mov(R6, R1)]
    if split:
        items += [ldx(B, R0, R6, 12), exit_()]
    else:
        items += [ja("flt_run")]
    items += [label("copy"), mov(R6, R7), label("flt_run"), ldx(B, R0, R6, 12), exit_()]
    return items


def _kinds_at(items, slot, prog_type=TRACING, **kw):
    return register_kinds(items, prog_type, **kw)[slot]


# ---- the mix that broke, and its fix ------------------------------------------------------------------------------

def test_the_mix_that_broke_is_refused():
    with pytest.raises(PointerKindError) as raised:
        check(_mixed_filter(), TRACING)
    e = raised.value
    assert str(e) == ("insn 9 (after label flt_run): r6 is map_value on one path and mem_untrusted on another: "
                      "r0 = *(u8 *)(r6 +12)")
    assert (e.insn, e.label, e.reg, e.kinds) == (9, "flt_run", R6, Kind.MAP_VALUE | Kind.MEM_UNTRUSTED)
    assert e.text == "r0 = *(u8 *)(r6 +12)" and e.errno is None and isinstance(e, BPFError)
    # the slot is the one asm.disassemble prints
    assert "    9: r0 = *(u8 *)(r6 +12)" in asm.disassemble(_mixed_filter()).splitlines()


def test_without_the_annotation_the_mix_is_still_refused():
    """skb->head read as a plain member: a kernel struct pointer (btf) against the map value, refused all the same."""
    items = [it for it in _mixed_filter() if not isinstance(it, asm.Holds)]
    with pytest.raises(PointerKindError, match="r6 is map_value on one path and btf on another"):
        check(items, TRACING)


def test_one_load_per_path_passes():
    check(_mixed_filter(split=True), TRACING)
    kinds = register_kinds(_mixed_filter(split=True), TRACING)
    assert kinds[7][R6] == Kind.MEM_UNTRUSTED and kinds[11][R6] == Kind.MAP_VALUE


def test_jumps_by_offset_as_by_label():
    """The resolved program (offsets, no labels, no Holds) is checked the same: it names no label."""
    with pytest.raises(PointerKindError, match=r"^insn 9: r6 is map_value on one path and btf on another"):
        check(asm.resolve(_mixed_filter()), TRACING)
    check(asm.resolve(_mixed_filter(split=True)), TRACING)
    assert register_kinds(asm.resolve(_mixed_filter()), TRACING)[9][R6] == Kind.MAP_VALUE | Kind.BTF


def test_three_kinds():
    items = [ld_map_value(R6, 3), movi(R0, 0), jmp(JEQ, R0, 0, "use"), jmp(JEQ, R0, 1, "b"), jmp(JEQ, R0, 2, "c"),
             mov(R6, FP), ja("use"), label("b"), mov(R6, R1), ja("use"), label("c"), ldx(DW, R6, R1, 8), label("use"),
             ldx(W, R0, R6, -8), exit_()]
    with pytest.raises(PointerKindError, match="r6 is one of ctx, stack, map_value, btf, by path"):
        check(items, TRACING)


def test_scalar_on_one_path_pointer_on_another_is_no_error():
    """The verifier's ranges may prove the scalar path dead (a null check, a length test): not ours to refuse."""
    items = [ld_map_value(R6, 3), movi(R0, 0), jmp(JEQ, R0, 0, "use"), movi(R6, 0), label("use"),
             ldx(B, R0, R6, 0), exit_()]
    check(items, TRACING)
    assert _kinds_at(items, 5)[R6] == Kind.SCALAR | Kind.MAP_VALUE
    # an uninitialised register on one path counts for nothing either
    check([movi(R0, 0), jmp(JEQ, R0, 0, "use"), ld_map_value(R2, 3), label("use"), ldx(B, R0, R2, 0), exit_()],
          TRACING)


# ---- stores -------------------------------------------------------------------------------------------------------

def _two_kinds_in_r2(*tail) -> list:
    return [ld_map_value(R2, 3), movi(R0, 0), jmp(JEQ, R0, 0, "use"), mov(R2, FP), asm.addi(R2, -8),
            label("use"), *tail, movi(R0, 0), exit_()]


@pytest.mark.parametrize("store", [st(W, R2, 0, 7), stx(DW, R2, 0, R0), asm.atomic_add(DW, R2, 0, R0),
                                   asm.fetch_add(W, R2, 0, R0), asm.store_release(DW, R2, 0, R0)],
                         ids=["st", "stx", "atomic_add", "fetch_add", "store_release"])
def test_stores_are_checked(store):
    with pytest.raises(PointerKindError, match="r2 is stack on one path and map_value on another"):
        check(_two_kinds_in_r2(store), TRACING)


def test_only_the_base_register_counts():
    """Storing a register of two kinds is no access through it (a spill of it to the stack is fine)."""
    items = [ld_map_value(R2, 3), movi(R0, 0), jmp(JEQ, R0, 0, "use"), mov(R2, FP), label("use"),
             stx(DW, FP, -8, R2), ldx(DW, R3, FP, -8), movi(R0, 0), exit_()]
    check(items, TRACING)
    assert _kinds_at(items, 8)[R3] == Kind.STACK | Kind.MAP_VALUE


# ---- registers and the stack --------------------------------------------------------------------------------------

def test_spills_and_fills_across_a_helper_call():
    items = [ld_map_value(R6, 3), stx(DW, FP, -16, R6), mov(R1, FP), asm.addi(R1, -8), movi(R2, 8), mov(R3, R6),
             call(Helper.probe_read_kernel), ldx(DW, R4, FP, -16), ldx(W, R5, FP, -16), ldx(DW, R0, FP, -8),
             movi(R0, 0), exit_()]
    kinds = register_kinds(items, TRACING)
    after_call = kinds[8]
    assert after_call[R1:R6] == (Kind(0),) * 5          # R1-R5: not initialised after a call
    assert after_call[R6] == Kind.MAP_VALUE and after_call[R0] == Kind.SCALAR
    assert kinds[9][R4] == Kind.MAP_VALUE             # the aligned DW fill of a DW spill: the spilled kind
    assert kinds[10][R5] == Kind.SCALAR               # part of it: a scalar
    check(items, TRACING)
    # the filled value is what a load through it checks: a map value filled on one path, the skb on the other
    mix = [ldx(DW, R6, R1, 0), ld_map_value(R7, 3), stx(DW, FP, -8, R7), movi(R0, 0), jmp(JEQ, R0, 0, "skb"),
           call(Helper.ktime_get_ns), ldx(DW, R6, FP, -8), label("skb"), ldx(B, R0, R6, 0), exit_()]
    with pytest.raises(PointerKindError, match="r6 is map_value on one path and btf on another"):
        check(mix, TRACING)


def test_a_store_over_a_spill_makes_it_a_scalar():
    base = [ld_map_value(R6, 3), stx(DW, FP, -16, R6)]
    tail = [ldx(DW, R4, FP, -16), movi(R0, 0), exit_()]
    for store, kind in ((st(W, FP, -12, 0), Kind.SCALAR), (stx(B, FP, -16, R6), Kind.SCALAR),
                        (stx(DW, FP, -24, R1), Kind.MAP_VALUE), (stx(DW, FP, -16, R1), Kind.CTX)):
        items = base + [store] + tail
        assert _kinds_at(items, 5)[R4] == kind, asm.format_insn(store)
    # through another stack pointer with a known offset
    items = base + [mov(R2, FP), asm.addi(R2, -20), st(W, R2, 4, 0)] + tail
    assert _kinds_at(items, 7)[R4] == Kind.SCALAR
    # a spill through an unknown stack offset is no fill of a kind
    items = [mov(R2, FP), asm.alu64(ADD, R2, R9, reg=True), ld_map_value(R6, 3), stx(DW, R2, 0, R6),
             ldx(DW, R4, R2, 0), movi(R0, 0), exit_()]
    assert _kinds_at(items, 6)[R4] == Kind.SCALAR


def test_pointer_arithmetic():
    items = [ld_map_value(R6, 3), ldx(W, R2, R6, 0), mov(R3, R6), asm.alu64(ADD, R3, R2, reg=True),
             mov(R4, R2), asm.alu64(ADD, R4, R6, reg=True), mov(R5, R6), asm.alu64(SUB, R5, R3, reg=True),
             mov(R7, R6), asm.alu32(ADD, R7, 1), mov(R8, R6), asm.andi(R8, 7), mov(R9, R6), asm.addi(R9, 16),
             movi(R0, 0), exit_()]
    end = _kinds_at(items, 16)
    assert end[R3] == end[R4] == end[R9] == Kind.MAP_VALUE      # pointer + scalar, scalar + pointer, + imm
    assert end[R5] == end[R7] == end[R8] == Kind.SCALAR         # pointer - pointer, 32-bit, other ops
    assert _kinds_at([ld_map_fd(R1, 4), asm.ld_imm64(R2, 1 << 40), exit_()], 4)[R1:R3] == (Kind.MAP_PTR, Kind.SCALAR)


def test_helper_and_kfunc_returns():
    items = [call(Helper.map_lookup_elem), mov(R6, R0), call(Helper.get_current_task_btf), mov(R7, R0),
             call(Helper.ringbuf_reserve), mov(R8, R0), call(Helper.ktime_get_ns), mov(R9, R0),
             asm.kfunc_call(1234), movi(R0, 0), exit_()]
    k = _kinds_at(items, 9)
    assert (k[R6], k[R7], k[R8], k[R9], k[R0]) == (Kind.MAP_VALUE, Kind.BTF, Kind.MEM, Kind.SCALAR, Kind.SCALAR)
    assert _kinds_at(items, 9, kfuncs={1234: Kind.BTF})[R0] == Kind.BTF


def test_a_bpf_to_bpf_call_is_refused_clearly():
    items = [movi(R0, 0), asm.Insn(asm.JMP | asm.CALL, 0, 1, 0, 1), exit_(), movi(R0, 0), exit_()]
    with pytest.raises(PointerKindError, match="insn 1: a BPF-to-BPF call, which the pointer-kind check does not "
                                               "follow .*check_kinds=False"):
        check(items, TRACING)


def test_loops_converge():
    """A bounded loop: the state at its head grows until it holds still; what the back edge brings counts."""
    ok = [ld_map_value(R6, 3), movi(R7, 8), mov(R8, FP), label("loop"), ldx(B, R0, R6, 0), st(B, R8, -1, 0),
          asm.addi(R8, -1), asm.addi(R6, 1), asm.addi(R7, -1), jmp(JNE, R7, 0, "loop"), movi(R0, 0), exit_()]
    check(ok, TRACING)
    assert _kinds_at(ok, 5)[R8] == Kind.STACK and _kinds_at(ok, 5)[R6] == Kind.MAP_VALUE
    bad = [ld_map_value(R6, 3), movi(R7, 8), label("loop"), ldx(B, R0, R6, 0), mov(R6, FP), asm.addi(R6, -8),
           asm.addi(R7, -1), jmp(JNE, R7, 0, "loop"), movi(R0, 0), exit_()]
    with pytest.raises(PointerKindError, match="insn 3 \\(after label loop\\): r6 is stack on one path and "
                                               "map_value on another"):
        check(bad, TRACING)
    # loops inside loops, the kinds handed on by a spill two back edges away
    nested = [ld_map_value(R6, 3), stx(DW, FP, -8, R6), movi(R7, 4), label("outer"), movi(R8, 4), label("inner"),
              ldx(DW, R6, FP, -8), ldx(B, R0, R6, 0), asm.addi(R8, -1), jmp(JNE, R8, 0, "inner"),
              stx(DW, FP, -8, R1), asm.addi(R7, -1), jmp(JNE, R7, 0, "outer"), movi(R0, 0), exit_()]
    with pytest.raises(PointerKindError, match="r6 is ctx on one path and map_value on another"):
        check(nested, TRACING)
    check(asm.resolve(ok), TRACING)


# ---- the context --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prog_type, loads", [
    (ProgType.TRACING, {(0, 8): Kind.BTF, (8, 8): Kind.BTF, (0, 4): Kind.SCALAR}),
    (ProgType.XDP, {(0, 4): Kind.PACKET, (4, 4): Kind.PACKET_END, (8, 4): Kind.PACKET, (12, 4): Kind.SCALAR}),
    (ProgType.SCHED_CLS, {(76, 4): Kind.PACKET, (80, 4): Kind.PACKET_END, (140, 4): Kind.PACKET,
                          (0, 4): Kind.SCALAR, (76, 2): Kind.SCALAR}),
    (ProgType.SOCKET_FILTER, {(76, 4): Kind.PACKET, (80, 4): Kind.PACKET_END}),
    (ptrkinds.CGROUP_SKB, {(76, 4): Kind.PACKET}),
    (ptrkinds.SCHED_ACT, {(80, 4): Kind.PACKET_END}),
    (ProgType.RAW_TRACEPOINT, {(0, 8): Kind.SCALAR}),
    (ProgType.KPROBE, {(112, 8): Kind.SCALAR}),
    (ProgType.TRACEPOINT, {(8, 8): Kind.SCALAR}),
    (ptrkinds.PERF_EVENT, {(0, 8): Kind.SCALAR}),
])
def test_context_rules(prog_type, loads):
    rule = ctx_rule(prog_type)
    for (off, size), kind in loads.items():
        assert rule(off, size) == kind, (prog_type, off, size)
        items = [ldx(asm.BYTES_SIZE[size], R2, R1, off), movi(R0, 0), exit_()]
        assert _kinds_at(items, 1, prog_type)[R2] == kind


def test_btf_member_loads():
    """A DW member of a kernel struct is a struct pointer (it may be a u64: harmless), a smaller one a scalar."""
    items = [ldx(DW, R6, R1, 0), ldx(DW, R2, R6, 16), ldx(W, R3, R6, 16), ldx(DW, R4, R2, 0), movi(R0, 0), exit_()]
    k = _kinds_at(items, 4)
    assert (k[R2], k[R3], k[R4]) == (Kind.BTF, Kind.SCALAR, Kind.BTF)
    assert _kinds_at(items, 4, ProgType.KPROBE)[R2] == Kind.SCALAR   # (kprobe: the context holds no pointers)


def test_context_offsets_are_the_uapi_structs():
    """The packet pointers' offsets against this host's BTF (skipped where it has none)."""
    from bpf.btf import BTF
    try:
        vm = BTF.vmlinux()
    except BPFError as e:
        pytest.skip(f"no vmlinux BTF: {e}")
    for struct, table in (("__sk_buff", ptrkinds.SK_BUFF), ("xdp_md", ptrkinds.XDP_MD)):
        t = vm.find(struct, "struct")
        assert {t.member(m)[1] // 8 for m in ("data", "data_end", "data_meta")} == set(table), struct


# ---- Holds in bpf.asm ---------------------------------------------------------------------------------------------

def test_holds_in_asm():
    items = _mixed_filter()
    plain = [it for it in items if not isinstance(it, asm.Holds)]
    assert asm.assemble(items) == asm.assemble(plain)          # no slot, no byte
    assert asm.resolve(items) == asm.resolve(plain)
    listing = asm.disassemble(items).splitlines()
    assert listing[4:6] == ["    5: r1 = *(u64 *)(r6 +200)", "       ; r1: mem_untrusted"]
    assert len([ln for ln in listing if ln[:5].strip().isdigit()]) == len(asm.resolve(items))
    assert asm.Holds in asm.Item.__args__ and holds(R3, "btf") == asm.Holds(R3, "btf")
    with pytest.raises(AsmError, match="unknown pointer kind 'heap'"):
        check([holds(R1, "heap"), exit_()], TRACING)


def test_holds_is_no_instruction_to_the_snapshot_placer():
    """fcap.kernel.snapshot looks at items' labels and jump targets only: a Holds is neither."""
    from fcap.kernel.snapshot import Snapshot
    s = Snapshot()
    items: list = [movi(R0, 0)]
    s.mark(items)
    items += [holds(R1, "mem_untrusted"), jmp(JEQ, R0, 0, "out")]
    s.mark(items)
    items.append(s.load(W, R2, R7, 16))
    copy = s.take(R7, R6)
    s.place(items, R7, R6)    # the copy goes at the later mark: nothing between the marks reads the skb
    assert copy and items == [movi(R0, 0), holds(R1, "mem_untrusted"), jmp(JEQ, R0, 0, "out"), *copy, items[-1]]


# ---- bpf.prog.load checks before it loads --------------------------------------------------------------------------

class _Loaded(Exception):
    pass


def _no_syscall(*_args, **_kw):
    raise _Loaded("bpf(BPF_PROG_LOAD) reached")


def test_load_checks_before_any_system_call(monkeypatch):
    monkeypatch.setattr(prog, "bpf_errno", _no_syscall)
    with pytest.raises(PointerKindError, match="insn 9 .*map_value on one path and mem_untrusted"):
        prog.load(ProgType.TRACING, iter(_mixed_filter()), name="mixed")
    with pytest.raises(_Loaded):      # a clean program, or the check turned off, goes on to the kernel
        prog.load(ProgType.TRACING, _mixed_filter(split=True), name="split")
    with pytest.raises(_Loaded):
        prog.load(ProgType.TRACING, _mixed_filter(), name="mixed", check_kinds=False)


def test_load_passes_kfuncs_on(monkeypatch):
    monkeypatch.setattr(prog, "bpf_errno", _no_syscall)
    items = [ld_map_value(R6, 3), movi(R0, 0), jmp(JEQ, R0, 0, "use"), asm.kfunc_call(77), mov(R6, R0),
             label("use"), ldx(B, R0, R6, 0), exit_()]
    with pytest.raises(_Loaded):
        prog.load(ProgType.TRACING, items)
    with pytest.raises(PointerKindError, match="map_value on one path and mem on another"):
        prog.load(ProgType.TRACING, items, kfuncs={77: Kind.MEM})


def test_verdicts_kept_by_shape(monkeypatch):
    """Programs that differ in constants only (point ids, map fds, compared values) are checked once."""
    runs = []
    real = ptrkinds._run
    monkeypatch.setattr(ptrkinds, "_run", lambda *a, **kw: (runs.append(1), real(*a, **kw)))
    ptrkinds._CACHE.clear()

    def program(point_id: int, fd: int, stack_off: int) -> list:
        return [ld_map_value(R6, fd), movi(R2, point_id), stx(W, R6, 0, R2), mov(R3, FP),
                asm.addi(R3, stack_off), st(DW, R3, 0, point_id), jmp(JEQ, R2, point_id, "x"), label("x"),
                movi(R0, 0), exit_()]
    check(program(1, 3, -8), TRACING)
    check(program(2, 9, -8), TRACING)
    assert len(runs) == 1
    check(program(2, 9, -16), TRACING)     # a stack offset changes what the check sees
    check(program(1, 3, -8), ProgType.KPROBE)
    assert len(runs) == 3
    with pytest.raises(PointerKindError):  # errors are never kept: found again each time
        check(_mixed_filter(), TRACING)
    with pytest.raises(PointerKindError):
        check(_mixed_filter(), TRACING)


# ---- no false positive on the tests' own programs ------------------------------------------------------------------

@pytest.mark.parametrize("prog_type", [ProgType.XDP, ProgType.SCHED_CLS])
def test_the_tests_xdp_and_tc_programs(prog_type):
    items = bpfprogs.body(prog_type, 4000, 4001, 3)
    check(items, prog_type)
    k = register_kinds(items, prog_type)
    assert k[6][R2] == Kind.PACKET and k[6][R3] == Kind.PACKET_END


def _harness_items(progs, slow: bool) -> list:
    """cbpf_harness.Harness's program over map fds 3 and 4 (the same items, no kernel needed)."""
    from bpf import cbpf
    ctx, buf, wirelen, buflen = R6, R7, R8, R9
    items = [mov(ctx, R1), ld_map_value(buf, 3), ldx(W, wirelen, ctx, 0), asm.addi(wirelen, -HARNESS.BASE)]
    if slow:
        model = cbpf.PacketModel(buf, wirelen, wirelen, 4096, HARNESS.skb_slow_load(HARNESS.BASE, -8),
                                 HARNESS.skb_ancillary)
    else:
        model = cbpf.PacketModel(buf, buflen, wirelen, 4096, ancillary=HARNESS.skb_ancillary)
    for i, p in enumerate(progs):
        if not slow:
            items += [mov(buflen, wirelen)]
        items += cbpf.translate(p, model, result=R0, done=f"f{i}_done", prefix=f"f{i}", stack_off=-80)
        items += [label(f"f{i}_done"), ld_map_value(R1, 4, 4 * i), stx(W, R1, 0, R0)]
    return items + [exit_()]


@pytest.mark.parametrize("slow", [False, True], ids=["buffer", "slow-loads"])
def test_translated_cbpf_filters(slow):
    pytest.importorskip("pcapy")
    exprs = HARNESS.OWN_EN10MB + ["ip6 protochain 6", "ip protochain 17", "tcp port 80 or udp port 53",
                                  "ether[ether[13] + 20] > 0x10"]
    progs = []
    for e in exprs:
        try:
            progs.append(HARNESS.compile_filter("EN10MB", e).get_bpf())
        except Exception:   # (an expression this libpcap does not know)
            continue
    items = _harness_items(progs, slow)
    check(items, ProgType.SCHED_CLS)
    assert any(isinstance(it, asm.Insn) and it.target and it.target.startswith("f") for it in items)


def test_every_builder_and_opcode_class():
    """Each instruction kind bpf.asm builds runs through the interpreter (no crash, no false alarm)."""
    items = [mov(R6, R1), asm.ld_imm64(R2, 5), ld_map_fd(R3, 4), ld_map_value(R4, 4, 8), asm.mov32(R5, R2),
             asm.alu32(asm.MUL, R5, 3), asm.arsh(R5, R2), asm.arshi(R5, 2), asm.be(R5, 16), asm.lshi(R5, 1),
             asm.rshi(R5, 1), asm.Insn(asm.LD | asm.ABS | W, 0, 0, 0, 12), asm.Insn(asm.LD | asm.IND | B, 0, R5, 0, 1),
             asm.Insn(asm.LDX | asm.MEMSX | W, R7, R4, 0), asm.jmp32(JNE, R7, 0, "next"), label("next"),
             asm.jmp(JNE, R7, 0, 1), asm.Insn(asm.JMP32 | asm.JA, 0, 0, 0, 0), movi(R0, 0), exit_()]
    check(items, ProgType.SOCKET_FILTER)
    k = register_kinds(items, ProgType.SOCKET_FILTER)
    assert k[15][R0] == Kind.SCALAR and k[15][R1] == Kind(0) and k[17][R7] == Kind.SCALAR
    with pytest.raises(AsmError, match="jump to slot"):
        check([asm.jmp(JNE, R0, 0, 5), exit_()], TRACING)
    with pytest.raises(AsmError, match="unknown label"):
        check([ja("nowhere"), exit_()], TRACING)
