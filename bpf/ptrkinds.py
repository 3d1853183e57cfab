"""Pointer kinds per register and stack slot on every path: a load or store through more than one is refused."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import IntFlag

from . import asm
from .asm import (ADD, ALU, ALU64, ATOMIC, CALL, DW, EXIT, FETCH, IMM, JA, JMP, JMP32, LD, LDX, MEMSX, MOV,
                  SIZE_BYTES, ST, STORE_REL, STX, SUB, X, Holds, Insn, Label)
from .errors import AsmError, PointerKindError
from .uapi import PSEUDO_CALL, PSEUDO_KFUNC_CALL, PSEUDO_MAP_FD, PSEUDO_MAP_VALUE, Helper, ProgType

__all__ = ["HELPER_RETURNS", "POINTERS", "CtxLoad", "Kind", "check", "ctx_rule", "register_kinds"]


class Kind(IntFlag):
    """What a register (or spilled stack slot) may hold; a set of them is what it holds on the paths reaching a
    point. Holds annotations name them in lower case ("mem_untrusted")."""

    SCALAR = 1 << 0
    CTX = 1 << 1             # the program's context
    STACK = 1 << 2           # FP, FP + k
    MAP_PTR = 1 << 3         # ld_imm64 of a map fd
    MAP_VALUE = 1 << 4       # a map value (null or not): ld_imm64 of one, map_lookup_elem's result
    BTF = 1 << 5             # PTR_TO_BTF_ID: a kernel struct
    MEM_UNTRUSTED = 1 << 6   # memory the JIT guards (PROBE_MEM): skb->head read from a BTF-typed skb
    PACKET = 1 << 7          # direct packet access: data, data_meta
    PACKET_END = 1 << 8
    MEM = 1 << 9             # PTR_TO_MEM: ringbuf_reserve, dynptr_data


POINTERS = Kind((1 << 10) - 1) & ~Kind.SCALAR
_ONE = tuple(Kind(1 << b) for b in range(10))   # the kinds one by one, in bit order (as messages list them)
_SCALAR, _CTX, _STACK, _BTF, _PTRS = int(Kind.SCALAR), int(Kind.CTX), int(Kind.STACK), int(Kind.BTF), int(POINTERS)
_LOADS_SCALAR = _PTRS & ~(_CTX | _STACK | _BTF) | _SCALAR   # bases whose loads give scalars

CtxLoad = Callable[[int, int], Kind]   # (offset, size in bytes) of a load from the context -> what it gives

# R0 of a helper call (every other helper returns a scalar)
HELPER_RETURNS = {Helper.map_lookup_elem: Kind.MAP_VALUE, Helper.get_current_task_btf: Kind.BTF,
                  Helper.ringbuf_reserve: Kind.MEM, Helper.dynptr_data: Kind.MEM}

# ld_imm64's src (linux/bpf.h BPF_PSEUDO_*); fcap makes only the first two
PSEUDO_BTF_ID, PSEUDO_MAP_IDX, PSEUDO_MAP_IDX_VALUE = 3, 5, 6
_LD_IMM64 = {0: _SCALAR, PSEUDO_MAP_FD: int(Kind.MAP_PTR), PSEUDO_MAP_VALUE: int(Kind.MAP_VALUE),
             PSEUDO_BTF_ID: _BTF, PSEUDO_MAP_IDX: int(Kind.MAP_PTR), PSEUDO_MAP_IDX_VALUE: int(Kind.MAP_VALUE)}
LOAD_ACQ = 0x100   # BPF_LOAD_ACQ (Linux 6.15+): dst = load_acquire(src + off), an STX|ATOMIC encoding
CMPXCHG = 0xF0 | FETCH

# program types bpf.uapi.ProgType does not name (fcap loads none): linux/bpf.h's numbers
SCHED_ACT, PERF_EVENT, CGROUP_SKB = 4, 7, 8
# the context's packet pointers: (offset: kind) of the UAPI structs, as this host's vmlinux BTF lays them out
XDP_MD = {0: Kind.PACKET, 4: Kind.PACKET_END, 8: Kind.PACKET}        # struct xdp_md: data, data_end, data_meta
SK_BUFF = {76: Kind.PACKET, 80: Kind.PACKET_END, 140: Kind.PACKET}   # struct __sk_buff: data, data_end, data_meta


def _scalar_ctx(off: int, size: int) -> Kind:
    return Kind.SCALAR


def _tracing_ctx(off: int, size: int) -> Kind:
    """An array of u64 arguments: a pointer argument is a kernel struct (a scalar one taken for one is harmless)."""
    return Kind.BTF if size == 8 else Kind.SCALAR


def _fields(table: dict[int, Kind]) -> CtxLoad:
    def load(off: int, size: int) -> Kind:
        return table.get(off, Kind.SCALAR) if size in (4, 8) else Kind.SCALAR
    return load


_XDP_CTX, _SKB_CTX = _fields(XDP_MD), _fields(SK_BUFF)


def ctx_rule(prog_type: int) -> CtxLoad:
    """What loads from the context give in a program of this type (bpf.uapi.ProgType, or linux/bpf.h's number)."""
    if prog_type == ProgType.TRACING:
        return _tracing_ctx
    if prog_type == ProgType.XDP:
        return _XDP_CTX
    if prog_type in (ProgType.SOCKET_FILTER, ProgType.SCHED_CLS, SCHED_ACT, CGROUP_SKB):
        return _SKB_CTX
    return _scalar_ctx   # RAW_TRACEPOINT, KPROBE, TRACEPOINT, PERF_EVENT, ...


# ---- compiled form: one step per instruction, join points where jumps land --------------------------------------

(_JOIN, _HOLDS, _DEF, _MOV, _ADDK, _ADDX, _SUBX, _LDX, _LDXS, _ST, _STX, _ATOMIC, _JA, _JCOND, _CALL, _EXIT,
 _LDABS) = range(17)
_SUBK, _LDIMM, _JA32, _OTHER = 100, 101, 102, 103   # (opcode classes that become one of the steps above)
_IMM_MATTERS = frozenset({ALU64 | ADD, ALU64 | SUB, JMP | CALL, JMP32 | JA} | {STX | ATOMIC | s for s in SIZE_BYTES})


def _opcode_table() -> list[int]:
    """What each of the 256 opcodes becomes (before its operands are looked at)."""
    out = []
    for op in range(256):
        cls, o, mode = op & 7, op & 0xF0, op & 0xE0
        if cls == ALU64:
            c = {MOV: _MOV if op & X else _DEF, ADD: _ADDX if op & X else _ADDK,
                 SUB: _SUBX if op & X else _SUBK}.get(o, _DEF)
        elif cls == ALU:
            c = _DEF
        elif cls == LDX:
            c = _LDXS if mode == MEMSX else _LDX
        elif cls == ST:
            c = _ST
        elif cls == STX:
            c = _ATOMIC if mode == ATOMIC else _STX
        elif cls == LD:
            c = _LDIMM if op == LD | DW | IMM else _LDABS
        elif o == CALL:
            c = _CALL
        elif o == EXIT:
            c = _EXIT
        elif o == JA:
            c = _JA if cls == JMP else _JA32
        else:
            c = _JCOND
        out.append(c)
    return out


_OPCODE = _opcode_table()
_SIZE = [SIZE_BYTES[op & 0x18] for op in range(256)]


class _Program:
    """The program as steps: tuples (code, operands...), memory accesses with their instruction's index (among the
    Insns) last; slots: each step's slot (-1: a join or a Holds); nxt[i]: the first join step at or after step i."""

    def __init__(self, items: list, kfuncs: Mapping[int, int]):
        self.items = items
        rel: set[int] = set()
        while True:
            missing = self._compile(items, kfuncs, rel)
            if not missing:
                break
            rel |= missing   # jumps by offset land where no join is: again, with joins there

    def _compile(self, items: list, kfuncs: Mapping[int, int], rel: set[int]) -> set[int]:  # noqa: C901
        steps: list = []
        slots: list[int] = []
        at_label: dict[str, int] = {}
        at_slot: dict[int, int] = {}
        jumps: list[tuple[int, object]] = []       # (step, label name or target slot)
        join = None                                 # a join step nothing follows yet
        pos = k = 0
        append, opcode = steps.append, _OPCODE
        for it in items:
            t = type(it)
            if t is Insn:
                op, d, s, off, imm, target, imm64 = it
                if rel and pos in rel:
                    if join is None:
                        join = len(steps)
                        append((_JOIN, False))
                        slots.append(-1)
                    at_slot[pos] = join
                join = None
                slots.append(pos)
                c = opcode[op]
                if c == _LDX or c == _LDXS:
                    append((c, d, s, off, _SIZE[op], k))
                elif c == _JCOND or c == _JA or c == _JA32:
                    jumps.append((len(steps), target if target is not None
                                  else pos + 1 + (imm if c == _JA32 else off)))
                    append((_JA if c == _JA32 else c, 0))
                elif c == _DEF:
                    append((_DEF, d, _SCALAR))
                elif c == _MOV:
                    append((_MOV, d, s) if off == 0 else (_DEF, d, _SCALAR))   # (off: movsx, a scalar)
                elif c == _ADDK or c == _SUBK:
                    append((_ADDK, d, imm if c == _ADDK else -imm))
                elif c == _STX or c == _ST:
                    append((_STX, d, off, _SIZE[op], s, k) if c == _STX else (_ST, d, off, _SIZE[op], k))
                elif c == _LDIMM:
                    append((_DEF, d, _LD_IMM64.get(s, _SCALAR)))
                    pos += 1
                elif c == _CALL:
                    if s == 0:
                        append((_CALL, int(HELPER_RETURNS.get(imm, _SCALAR))))
                    elif s == PSEUDO_KFUNC_CALL:
                        append((_CALL, int(kfuncs.get(imm, _SCALAR))))
                    else:
                        slot, lbl, _ = self.where(k)
                        what = "a BPF-to-BPF call" if s == PSEUDO_CALL else f"a call of unknown kind (src {s})"
                        raise PointerKindError(f"{_where(slot, lbl)}: {what}, which the pointer-kind check does not "
                                               f"follow (load with check_kinds=False): {asm.format_insn(it)}",
                                               slot, lbl)
                elif c == _ATOMIC:
                    if imm == STORE_REL:
                        append((_STX, d, off, _SIZE[op], s, k))
                    elif imm == LOAD_ACQ:
                        append((_LDX, d, s, off, _SIZE[op], k))
                    else:
                        fetch = -1 if not imm & FETCH else (asm.R0 if imm == CMPXCHG else s)
                        append((_ATOMIC, d, off, _SIZE[op], fetch, k))
                else:   # _ADDX, _SUBX, _EXIT, _LDABS
                    append((c, d, s))
                k += 1
                pos += 1
            elif t is Label:
                if it.name in at_label:
                    raise AsmError(f"duplicate label {it.name!r}")
                if join is None:
                    join = len(steps)
                    append((_JOIN, False))
                    slots.append(-1)
                at_label[it.name] = join
            elif t is Holds:
                name = it.kind.upper() if isinstance(it.kind, str) else ""
                if name not in Kind.__members__:
                    raise AsmError(f"holds r{it.reg}: unknown pointer kind {it.kind!r} "
                                   f"(one of {', '.join(k.name.lower() for k in _ONE)})")
                append((_HOLDS, it.reg, int(Kind[name])))
                slots.append(-1)
                join = None
            else:
                raise AsmError(f"{it!r} is not an instruction, a label or a Holds")
        heads, missing = set(), set()
        for i, target in jumps:
            if isinstance(target, str):
                j = at_label.get(target)
                if j is None:
                    raise AsmError(f"jump to unknown label {target!r}")
            else:
                j = at_slot.get(target)
                if j is None:
                    if target in rel or not 0 <= target < pos:
                        raise AsmError(f"jump to slot {target}, not the start of an instruction")
                    missing.add(target)
                    continue
            steps[i] = (steps[i][0], j)
            if j <= i:
                heads.add(j)
        if missing:
            return missing
        for j in heads:
            steps[j] = (_JOIN, True)
        n = len(steps)
        nxt = [n] * (n + 1)
        for i in range(n - 1, -1, -1):
            nxt[i] = i if steps[i][0] == _JOIN else nxt[i + 1]
        self.steps, self.slots, self.nxt = steps, slots, nxt
        return missing

    def where(self, k: int) -> tuple[int, str | None, Insn]:
        """(slot, the label before it, the instruction) of the k-th instruction."""
        pos, last, n = 0, None, 0
        for it in self.items:
            if type(it) is Label:
                last = it.name
            elif type(it) is Insn:
                if n == k:
                    return pos, last, it
                n += 1
                pos += it.slots
        raise IndexError(k)


def _where(slot: int, lbl: str | None) -> str:
    return f"insn {slot} (after label {lbl})" if lbl else f"insn {slot}"


def _names(mask: int) -> list[str]:
    return [k.name.lower() for k in _ONE if mask & k]


def _mixed(prog: _Program, k: int, reg: int, mask: int) -> PointerKindError:
    slot, lbl, it = prog.where(k)
    names = _names(mask)
    how = (f"{names[0]} on one path and {names[1]} on another" if len(names) == 2
           else f"one of {', '.join(names)}, by path")
    text = asm.format_insn(it)
    return PointerKindError(f"{_where(slot, lbl)}: r{reg} is {how}: {text}", slot, lbl, reg, Kind(mask), text)


# ---- the abstract interpreter --------------------------------------------------------------------------------------
# A state: [regs, offs, stack]: regs[r] the kinds of register r (a bit mask; 0: not initialised), offs[r] its offset
# from FP when it holds STACK (None: not one known offset; 0 when it holds no STACK), stack {FP offset of an 8-byte
# slot: the kinds spilled there}.

def _copy(st: list) -> list:
    return [st[0][:], st[1][:], dict(st[2])]


def _join(dst: list, src: list) -> bool:
    """dst |= src; whether dst grew."""
    changed = False
    dr, do, ds = dst
    sr, so, ss = src
    if dr != sr or do != so:
        for r in range(11):
            a, b = dr[r], sr[r]
            m = a | b
            if m != a:
                dr[r] = m
                changed = True
            if b & _STACK:
                if not a & _STACK:
                    do[r] = so[r]
                elif do[r] != so[r] and do[r] is not None:
                    do[r] = None
                    changed = True
    if ds != ss:
        for key, v in ss.items():
            o = ds.get(key, 0)
            if v | o != o:
                ds[key] = v | o
                changed = True
    return changed


def _clobber(stack: dict, at: int | None, size: int) -> None:
    """A store that is no spill, of `size` bytes at FP+at: the slots it touches hold scalars."""
    if at is not None:
        for slot in range(at & ~7, at + size, 8):
            stack[slot] = _SCALAR


def _run(prog: _Program, ctx_load: CtxLoad, strict: bool = True,  # noqa: C901 - the interpreter: one branch per step
         record: dict | None = None) -> None:
    steps, nxt, n = prog.steps, prog.nxt, len(prog.steps)
    heads: dict[int, list] = {}   # loop heads' states, grown over passes
    while True:
        incoming: dict[int, list] = {}
        regs = [0] * 11
        regs[1], regs[10] = _CTX, _STACK
        offs = [0] * 11
        stack: dict[int, int] = {}
        live, again, i = True, False, 0
        while i < n:
            st = steps[i]
            c = st[0]
            if not live and c != _JOIN:
                i = nxt[i]
                continue
            if record is not None and c >= _DEF:
                record[prog.slots[i]] = tuple(regs)
            if c == _LDX or c == _LDXS:
                _, d, b, off, size, k = st
                m = regs[b]
                p = m & _PTRS
                if p & (p - 1) and strict:
                    raise _mixed(prog, k, b, p)
                res = _SCALAR if m & _LOADS_SCALAR or not m or c == _LDXS else 0
                if c == _LDX:
                    if m & _CTX:
                        res |= int(ctx_load(off, size))
                    if m & _BTF:
                        res |= _BTF if size == 8 else _SCALAR
                    if m & _STACK:
                        at = offs[b]
                        if at is None or size != 8 or (at + off) & 7:
                            res |= _SCALAR
                        else:
                            res |= stack.get(at + off, _SCALAR)
                regs[d] = res
                offs[d] = None if res & _STACK else 0
            elif c == _DEF:
                regs[st[1]] = st[2]
                offs[st[1]] = 0
            elif c == _JCOND or c == _JA:
                t = st[1]
                if c == _JA:
                    live = False
                if steps[t][1]:   # a loop head
                    h = heads.get(t)
                    if h is None:
                        heads[t] = [regs[:], offs[:], dict(stack)]
                        again = again or t <= i
                    elif _join(h, [regs, offs, stack]) and t <= i:
                        again = True
                else:
                    h = incoming.get(t)
                    if h is None:
                        incoming[t] = [regs, offs, stack] if c == _JA else [regs[:], offs[:], dict(stack)]
                    else:
                        _join(h, [regs, offs, stack])
            elif c == _MOV:
                regs[st[1]] = regs[st[2]]
                offs[st[1]] = offs[st[2]]
            elif c == _JOIN:
                if st[1]:   # a loop head: its state kept for the next pass
                    h = heads.get(i)
                    if live:
                        if h is None:
                            heads[i] = [regs[:], offs[:], dict(stack)]
                        else:
                            _join(h, [regs, offs, stack])
                            regs, offs, stack = _copy(h)
                    elif h is not None:
                        regs, offs, stack = _copy(h)
                        live = True
                else:
                    h = incoming.pop(i, None)
                    if h is not None:
                        if live:
                            _join(h, [regs, offs, stack])
                        else:
                            live = True
                        regs, offs, stack = h
            elif c == _ST or c == _STX or c == _ATOMIC:
                b, off, size = st[1], st[2], st[3]
                m = regs[b]
                p = m & _PTRS
                if p & (p - 1) and strict:
                    raise _mixed(prog, st[-1], b, p)
                if m & _STACK:
                    at = offs[b]
                    if at is not None:
                        at += off
                        if c == _STX and size == 8 and not at & 7:
                            stack[at] = regs[st[4]] or _SCALAR
                        else:
                            _clobber(stack, at, size)
                if c == _ATOMIC and st[4] >= 0:
                    regs[st[4]] = _SCALAR
                    offs[st[4]] = 0
            elif c == _ADDK:
                d = st[1]
                if regs[d] & _STACK and offs[d] is not None:
                    offs[d] += st[2]
            elif c == _CALL:
                regs[0], regs[1], regs[2], regs[3], regs[4], regs[5] = st[1], 0, 0, 0, 0, 0
                offs[0] = offs[1] = offs[2] = offs[3] = offs[4] = offs[5] = 0
            elif c == _EXIT:
                live = False
            elif c == _ADDX or c == _SUBX:
                d = st[1]
                a, b = regs[d], regs[st[2]]
                res = a if b & _SCALAR or not b else 0            # pointer +- scalar: the pointer
                if c == _ADDX and (a & _SCALAR or not a):
                    res |= b                                      # scalar + pointer: the pointer
                if a & _PTRS and b & _PTRS:
                    res |= _SCALAR                                # pointer - pointer: a scalar
                regs[d] = res or _SCALAR
                offs[d] = None if res & _STACK else 0
            elif c == _HOLDS:
                regs[st[1]] = st[2]
                offs[st[1]] = None if st[2] & _STACK else 0
            elif c == _LDABS:
                regs[0], regs[1], regs[2], regs[3], regs[4], regs[5] = _SCALAR, 0, 0, 0, 0, 0
                offs[0] = offs[1] = offs[2] = offs[3] = offs[4] = offs[5] = 0
            i += 1
        if not again:
            return


# ---- the interface --------------------------------------------------------------------------------------------------

_CACHE: dict[tuple, bool] = {}
CACHE_MAX = 64


def _shape(items: list) -> tuple:
    """What the check's verdict depends on: no constants but the offsets, callees and atomic operations."""
    out = []
    for it in items:
        if type(it) is Insn:
            op = it.op
            out.append((op, it.dst, it.src, it.off, it.target, it.imm if op in _IMM_MATTERS else 0))
        else:
            out.append(it)
    return tuple(out)


def check(items: Iterable[asm.Item], prog_type: int, *, kfuncs: Mapping[int, Kind] | None = None,
          ctx_load: CtxLoad | None = None) -> None:
    """Raise PointerKindError if a load or store of the program (instructions, labels, Holds) may run with more
    than one kind of pointer in its base register, by the paths that reach it: a verifier refuses that ("same
    insn cannot be used with different pointers"). A register that is a scalar on one path and a pointer on
    another is no error. prog_type chooses what context loads give (ctx_rule), unless ctx_load is given; kfuncs:
    {BTF id: what the kfunc returns} for kfuncs that return pointers (the others return scalars). Verdicts are
    kept by the program's shape (programs that differ in constants only are checked once)."""
    items = list(items)
    kf = dict(kfuncs or {})
    key = None
    if ctx_load is None:
        key = (int(prog_type), tuple(sorted((int(a), int(b)) for a, b in kf.items())), _shape(items))
        if key in _CACHE:
            return
    _run(_Program(items, kf), ctx_load or ctx_rule(prog_type))
    if key is not None:
        if len(_CACHE) >= CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = True


def register_kinds(items: Iterable[asm.Item], prog_type: int, *, kfuncs: Mapping[int, Kind] | None = None,
                   ctx_load: CtxLoad | None = None) -> dict[int, tuple[Kind, ...]]:
    """{slot: the kinds of R0..R10 on the paths that reach it} for each reachable instruction (the check's view,
    for tests and debugging; nothing is refused)."""
    record: dict[int, tuple[int, ...]] = {}
    prog = _Program(list(items), dict(kfuncs or {}))
    _run(prog, ctx_load or ctx_rule(prog_type), strict=False, record=record)
    return {slot: tuple(Kind(r) for r in regs) for slot, regs in sorted(record.items())}
