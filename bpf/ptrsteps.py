"""The pointer kinds, and a program as the pointer-kind check (bpf.ptrkinds) walks it: each instruction a step,
joins where paths meet, jump targets resolved, loop heads marked."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import IntFlag

from . import asm
from .asm import (ADD, ALU, ALU64, ATOMIC, CALL, DW, EXIT, FETCH, IMM, JA, JMP, JMP32, LD, LDX, MEMSX, MOV,
                  SIZE_BYTES, ST, STORE_REL, STX, SUB, X, Holds, Insn, Label)
from .errors import AsmError, PointerKindError
from .uapi import PSEUDO_CALL, PSEUDO_KFUNC_CALL, PSEUDO_MAP_FD, PSEUDO_MAP_VALUE, Helper



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


