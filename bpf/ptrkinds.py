"""Pointer kinds per register and stack slot on every path: a load or store through more than one is refused. The
kinds and the program as steps: bpf.ptrsteps."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from . import asm
from .asm import Insn
from .errors import PointerKindError
from .ptrsteps import (_ADDK, _ADDX, _ATOMIC, _BTF, _CALL, _CTX, _DEF, _EXIT, _HOLDS, _IMM_MATTERS, _JA, _JCOND,
                       _JOIN, _LDABS, _LDX, _LDXS, _LOADS_SCALAR, _MOV, _ONE, _PTRS, _SCALAR, _ST, _STACK, _STX,
                       _SUBX, HELPER_RETURNS, POINTERS, CtxLoad, Kind, _Program, _where)
from .uapi import ProgType

__all__ = ["HELPER_RETURNS", "POINTERS", "CtxLoad", "Kind", "check", "ctx_rule", "register_kinds"]


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
