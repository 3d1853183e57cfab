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

    def _compile(self, items: list, kfuncs: Mapping[int, int], rel: set[int]) -> set[int]:
        """Steps for the items, or the slots jumps by offset land on where no join step is yet."""
        b = _Build(self, kfuncs, rel)
        add = _ADD
        for it in items:
            step = add.get(type(it))
            if step is None:
                raise AsmError(f"{it!r} is not an instruction, a label or a Holds")
            step(b, it)
        missing = b.resolve()
        if not missing:
            self.steps, self.slots, self.nxt = b.finish()
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


class _Build:
    """One compilation's work: the steps so far, where labels and slots landed, the jumps to resolve."""

    __slots__ = ("prog", "kfuncs", "rel", "steps", "slots", "at_label", "at_slot", "jumps", "join", "pos", "k")

    def __init__(self, prog: _Program, kfuncs: Mapping[int, int], rel: set[int]):
        self.prog, self.kfuncs, self.rel = prog, kfuncs, rel
        self.steps: list = []
        self.slots: list[int] = []
        self.at_label: dict[str, int] = {}
        self.at_slot: dict[int, int] = {}
        self.jumps: list[tuple[int, object]] = []   # (step, label name or target slot)
        self.join: int | None = None                # a join step nothing follows yet
        self.pos = self.k = 0                       # the next instruction's slot and index

    def join_point(self) -> int:
        """The join step at this point (a new one unless nothing followed the last)."""
        if self.join is None:
            self.join = len(self.steps)
            self.steps.append((_JOIN, False))
            self.slots.append(-1)
        return self.join

    def resolve(self) -> set[int]:
        """Point the jump steps at their targets; the slots jumped to where no join step is (then nothing is
        done). Loop heads (joins jumped to from below) are marked."""
        steps, heads, missing = self.steps, set(), set()
        for i, target in self.jumps:
            j = self._target(target)
            if j is None:
                missing.add(target)
                continue
            steps[i] = (steps[i][0], j)
            if j <= i:
                heads.add(j)
        if not missing:
            for j in heads:
                steps[j] = (_JOIN, True)
        return missing

    def _target(self, target: object) -> int | None:
        """The join step of a jump's target: a label, or a slot (None: no join there yet)."""
        if isinstance(target, str):
            j = self.at_label.get(target)
            if j is None:
                raise AsmError(f"jump to unknown label {target!r}")
            return j
        j = self.at_slot.get(target)
        if j is None and (target in self.rel or not 0 <= target < self.pos):
            raise AsmError(f"jump to slot {target}, not the start of an instruction")
        return j

    def finish(self) -> tuple[list, list[int], list[int]]:
        """(steps, slots, nxt)."""
        steps = self.steps
        n = len(steps)
        nxt = [n] * (n + 1)
        for i in range(n - 1, -1, -1):
            nxt[i] = i if steps[i][0] == _JOIN else nxt[i + 1]
        return steps, self.slots, nxt


def _add_insn(b: _Build, it: Insn) -> None:
    pos = b.pos
    if pos in b.rel:
        b.at_slot[pos] = b.join_point()
    b.join = None
    b.slots.append(pos)
    c, emit = _BY_OP[it[0]]
    b.steps.append(emit(b, it, c))
    b.k += 1
    b.pos += 1


def _add_label(b: _Build, it: Label) -> None:
    if it.name in b.at_label:
        raise AsmError(f"duplicate label {it.name!r}")
    b.at_label[it.name] = b.join_point()


def _add_holds(b: _Build, it: Holds) -> None:
    name = it.kind.upper() if isinstance(it.kind, str) else ""
    if name not in Kind.__members__:
        raise AsmError(f"holds r{it.reg}: unknown pointer kind {it.kind!r} "
                       f"(one of {', '.join(k.name.lower() for k in _ONE)})")
    b.steps.append((_HOLDS, it.reg, int(Kind[name])))
    b.slots.append(-1)
    b.join = None


_ADD: dict[type, Callable] = {Insn: _add_insn, Label: _add_label, Holds: _add_holds}

# ---- one instruction's step, by what its opcode becomes (_OPCODE): emit(build, insn, code) -> the step

def _emit_load(b: _Build, it: Insn, c: int) -> tuple:
    op, d, s, off, _, _, _ = it
    return (c, d, s, off, _SIZE[op], b.k)


def _emit_jump(b: _Build, it: Insn, c: int) -> tuple:
    target = it.target
    if target is None:
        target = b.pos + 1 + (it.imm if c == _JA32 else it.off)
    b.jumps.append((len(b.steps), target))
    return (_JA if c == _JA32 else c, 0)


def _emit_def(b: _Build, it: Insn, c: int) -> tuple:
    return (_DEF, it[1], _SCALAR)


def _emit_mov(b: _Build, it: Insn, c: int) -> tuple:
    _, d, s, off, _, _, _ = it
    return (_MOV, d, s) if off == 0 else (_DEF, d, _SCALAR)   # (off: movsx, a scalar)


def _emit_addk(b: _Build, it: Insn, c: int) -> tuple:
    imm = it[4]
    return (_ADDK, it[1], imm if c == _ADDK else -imm)


def _emit_stx(b: _Build, it: Insn, c: int) -> tuple:
    op, d, s, off, _, _, _ = it
    return (_STX, d, off, _SIZE[op], s, b.k)


def _emit_st(b: _Build, it: Insn, c: int) -> tuple:
    op, d, _, off, _, _, _ = it
    return (_ST, d, off, _SIZE[op], b.k)


def _emit_ldimm(b: _Build, it: Insn, c: int) -> tuple:
    b.pos += 1   # two slots
    return (_DEF, it[1], _LD_IMM64.get(it[2], _SCALAR))


def _emit_call(b: _Build, it: Insn, c: int) -> tuple:
    s, imm = it[2], it[4]
    if s == 0:
        return (_CALL, int(HELPER_RETURNS.get(imm, _SCALAR)))
    if s == PSEUDO_KFUNC_CALL:
        return (_CALL, int(b.kfuncs.get(imm, _SCALAR)))
    slot, lbl, _ = b.prog.where(b.k)
    what = "a BPF-to-BPF call" if s == PSEUDO_CALL else f"a call of unknown kind (src {s})"
    raise PointerKindError(f"{_where(slot, lbl)}: {what}, which the pointer-kind check does not "
                           f"follow (load with check_kinds=False): {asm.format_insn(it)}", slot, lbl)


def _emit_atomic(b: _Build, it: Insn, c: int) -> tuple:
    op, d, s, off, imm, _, _ = it
    if imm == STORE_REL:
        return (_STX, d, off, _SIZE[op], s, b.k)
    if imm == LOAD_ACQ:
        return (_LDX, d, s, off, _SIZE[op], b.k)
    fetch = -1 if not imm & FETCH else (asm.R0 if imm == CMPXCHG else s)
    return (_ATOMIC, d, off, _SIZE[op], fetch, b.k)


def _emit_regs(b: _Build, it: Insn, c: int) -> tuple:
    return (c, it[1], it[2])   # _ADDX, _SUBX, _EXIT, _LDABS


_EMIT: dict[int, Callable[[_Build, Insn, int], tuple]] = {
    _LDX: _emit_load, _LDXS: _emit_load, _JCOND: _emit_jump, _JA: _emit_jump, _JA32: _emit_jump,
    _DEF: _emit_def, _MOV: _emit_mov, _ADDK: _emit_addk, _SUBK: _emit_addk, _STX: _emit_stx, _ST: _emit_st,
    _LDIMM: _emit_ldimm, _CALL: _emit_call, _ATOMIC: _emit_atomic,
    _ADDX: _emit_regs, _SUBX: _emit_regs, _EXIT: _emit_regs, _LDABS: _emit_regs}
_BY_OP = [(c, _EMIT[c]) for c in _OPCODE]   # by opcode: (what it becomes, its emit)


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


class _Pass:
    """The interpreter's state: the current one (regs, offs, stack; live: whether a path reaches this point), the
    states waiting at join steps ahead (incoming), the loop heads' (heads, kept over passes), and whether a loop
    head grew from below (again: another pass)."""

    __slots__ = ("prog", "ctx_load", "strict", "heads", "incoming", "regs", "offs", "stack", "live", "again")

    def __init__(self, prog: _Program, ctx_load: CtxLoad, strict: bool):
        self.prog, self.ctx_load, self.strict = prog, ctx_load, strict
        self.heads: dict[int, list] = {}   # loop heads' states, grown over passes

    def start(self) -> None:
        """The state at the program's start, for another pass."""
        regs = [0] * 11
        regs[1], regs[10] = _CTX, _STACK
        self.regs, self.offs, self.stack = regs, [0] * 11, {}
        self.incoming: dict[int, list] = {}
        self.live, self.again = True, False

    def state(self) -> list:
        return [self.regs, self.offs, self.stack]

    def base(self, k: int, b: int) -> int:
        """The kinds of base register b of the k-th instruction (a load or store), refused if pointers mix."""
        m = self.regs[b]
        p = m & _PTRS
        if p & (p - 1) and self.strict:
            raise _mixed(self.prog, k, b, p)
        return m


def _run(prog: _Program, ctx_load: CtxLoad, strict: bool = True, record: dict | None = None) -> None:
    p = _Pass(prog, ctx_load, strict)
    while True:
        p.start()
        _pass(p, record)
        if not p.again:
            return


def _pass(p: _Pass, record: dict | None) -> None:
    """Run the steps once, in order; record: {slot: the registers' kinds} of the live ones."""
    prog = p.prog
    steps, nxt, n, slots, step = prog.steps, prog.nxt, len(prog.steps), prog.slots, _STEP
    i = 0
    while i < n:
        st = steps[i]
        c = st[0]
        if not p.live and c != _JOIN:
            i = nxt[i]
            continue
        if record is not None and c >= _DEF:
            record[slots[i]] = tuple(p.regs)
        step[c](p, st, i)
        i += 1


# ---- one step each: step(pass, the step, its index) ----------------------------------------------------------------

def _step_join(p: _Pass, st: tuple, i: int) -> None:
    if st[1]:
        _at_head(p, i)
        return
    h = p.incoming.pop(i, None)
    if h is not None:
        if p.live:
            _join(h, p.state())
        else:
            p.live = True
        p.regs, p.offs, p.stack = h


def _at_head(p: _Pass, i: int) -> None:
    """A loop head: its state kept (and grown) for the next pass; on, with all it has seen."""
    h = p.heads.get(i)
    if p.live:
        if h is None:
            p.heads[i] = _copy(p.state())
            return
        _join(h, p.state())
    elif h is None:
        return
    p.regs, p.offs, p.stack = _copy(h)
    p.live = True


def _step_holds(p: _Pass, st: tuple, i: int) -> None:
    p.regs[st[1]] = st[2]
    p.offs[st[1]] = None if st[2] & _STACK else 0


def _step_def(p: _Pass, st: tuple, i: int) -> None:
    p.regs[st[1]] = st[2]
    p.offs[st[1]] = 0


def _step_mov(p: _Pass, st: tuple, i: int) -> None:
    p.regs[st[1]] = p.regs[st[2]]
    p.offs[st[1]] = p.offs[st[2]]


def _step_addk(p: _Pass, st: tuple, i: int) -> None:
    d, offs = st[1], p.offs
    if p.regs[d] & _STACK and offs[d] is not None:
        offs[d] += st[2]


def _step_addx(p: _Pass, st: tuple, i: int) -> None:
    c, d, s = st
    regs = p.regs
    a, b = regs[d], regs[s]
    res = a if b & _SCALAR or not b else 0            # pointer +- scalar: the pointer
    if c == _ADDX and (a & _SCALAR or not a):
        res |= b                                      # scalar + pointer: the pointer
    if a & _PTRS and b & _PTRS:
        res |= _SCALAR                                # pointer - pointer: a scalar
    regs[d] = res or _SCALAR
    p.offs[d] = None if res & _STACK else 0


def _step_load(p: _Pass, st: tuple, i: int) -> None:
    c, d, b, off, size, k = st
    m = p.base(k, b)
    res = _SCALAR if m & _LOADS_SCALAR or not m or c == _LDXS else 0
    if c == _LDX and m & (_CTX | _BTF | _STACK):
        res |= _loaded(p, m, b, off, size)
    p.regs[d] = res
    p.offs[d] = None if res & _STACK else 0


def _loaded(p: _Pass, m: int, b: int, off: int, size: int) -> int:
    """What a load of `size` bytes at off from a context, kernel struct or stack pointer (kinds m, in b) gives."""
    res = 0
    if m & _CTX:
        res |= int(p.ctx_load(off, size))
    if m & _BTF:
        res |= _BTF if size == 8 else _SCALAR
    if m & _STACK:
        at = p.offs[b]
        if at is None or size != 8 or (at + off) & 7:
            res |= _SCALAR
        else:
            res |= p.stack.get(at + off, _SCALAR)
    return res


def _step_store(p: _Pass, st: tuple, i: int) -> None:
    c, b, off, size = st[:4]
    m = p.base(st[-1], b)
    if m & _STACK:
        at = p.offs[b]
        if at is not None:
            at += off
            if c == _STX and size == 8 and not at & 7:
                p.stack[at] = p.regs[st[4]] or _SCALAR   # a spill
            else:
                _clobber(p.stack, at, size)
    if c == _ATOMIC and st[4] >= 0:
        p.regs[st[4]] = _SCALAR
        p.offs[st[4]] = 0


def _step_jump(p: _Pass, st: tuple, i: int) -> None:
    c, t = st
    if c == _JA:
        p.live = False
    if p.prog.steps[t][1]:   # a loop head
        h = p.heads.get(t)
        if h is None:
            p.heads[t] = _copy(p.state())
            p.again = p.again or t <= i
        elif _join(h, p.state()) and t <= i:
            p.again = True
        return
    h = p.incoming.get(t)
    if h is None:
        p.incoming[t] = p.state() if c == _JA else _copy(p.state())
    else:
        _join(h, p.state())


def _step_call(p: _Pass, st: tuple, i: int) -> None:
    regs, offs = p.regs, p.offs
    regs[0], regs[1], regs[2], regs[3], regs[4], regs[5] = st[1], 0, 0, 0, 0, 0
    offs[0] = offs[1] = offs[2] = offs[3] = offs[4] = offs[5] = 0


def _step_ldabs(p: _Pass, st: tuple, i: int) -> None:
    _step_call(p, (_CALL, _SCALAR), i)


def _step_exit(p: _Pass, st: tuple, i: int) -> None:
    p.live = False


_BY_CODE: dict[int, Callable[[_Pass, tuple, int], None]] = {
    _JOIN: _step_join, _HOLDS: _step_holds, _DEF: _step_def, _MOV: _step_mov, _ADDK: _step_addk, _ADDX: _step_addx,
    _SUBX: _step_addx, _LDX: _step_load, _LDXS: _step_load, _ST: _step_store, _STX: _step_store,
    _ATOMIC: _step_store, _JA: _step_jump, _JCOND: _step_jump, _CALL: _step_call, _EXIT: _step_exit,
    _LDABS: _step_ldabs}
_STEP = [_BY_CODE[c] for c in range(len(_BY_CODE))]   # by step code


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
