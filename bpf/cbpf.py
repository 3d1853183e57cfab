"""Classic BPF (cBPF) programs translated to eBPF, for packet bytes held in a buffer the verifier knows the size of."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import asm
from .asm import FP, R0, R1, R2, R6, R7, R8, R9, B, H, W
from .errors import CBPFError

__all__ = ["MEMWORDS", "CBPFError", "PacketModel", "disassemble", "translate", "validate"]


SlowLoad = Callable[[int, int, int, str], list]


@dataclass
class PacketModel:
    """How the translated program reaches packet bytes: the first `capacity` bytes sit in a buffer.

    buf: register (R6..R9) pointing at the packet's first byte (a map value or stack pointer whose size the verifier
      knows to be at least `capacity`).
    buflen: register (R6..R9) with the captured length that cBPF loads are checked against (u32 value). Without
      slow_load it must not exceed `capacity`; with slow_load it may (bytes past capacity come from slow_load).
    wirelen: register (R6..R9) with the packet's length on the wire (what BPF_LEN loads); may equal buflen.
    capacity: the buffer's size in bytes; a load reaching past it returns 0 (rejects) unless slow_load is given.
    slow_load(size, off_reg, dst, reject) -> items: code loading `size` (1/2/4) bytes at the offset in register
      off_reg into register dst (host order, zero-extended; the translator swaps bytes) or jumping to label
      `reject`; used for loads reaching past capacity. It may clobber R0-R5 (it may call helpers) and nothing else.
    """

    buf: int
    buflen: int
    wirelen: int
    capacity: int
    slow_load: SlowLoad | None = None


# ---- cBPF encoding -------------------------------------------------------------------------------

C_LD, C_LDX, C_ST, C_STX, C_ALU, C_JMP, C_RET, C_MISC = range(8)
S_W, S_H, S_B = 0x00, 0x08, 0x10
M_IMM, M_ABS, M_IND, M_MEM, M_LEN, M_MSH = 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0
SRC_K, SRC_X, RVAL_A = 0x00, 0x08, 0x10
J_JA, J_JEQ, J_JGT, J_JGE, J_JSET = 0x00, 0x10, 0x20, 0x30, 0x40
MISC_TAX, MISC_TXA = 0x00, 0x80
MEMWORDS = 16
SIZE = {S_W: 4, S_H: 2, S_B: 1}
_EBPF_SIZE = {4: W, 2: H, 1: B}
_ALU_OPS = {0x00: asm.ADD, 0x10: asm.SUB, 0x20: asm.MUL, 0x30: asm.DIV, 0x40: asm.OR, 0x50: asm.AND,
            0x60: asm.LSH, 0x70: asm.RSH, 0x80: asm.NEG, 0x90: asm.MOD, 0xA0: asm.XOR}
_JMP_OPS = {J_JEQ: asm.JEQ, J_JGT: asm.JGT, J_JGE: asm.JGE, J_JSET: asm.JSET}
_NEGATED = {asm.JEQ: asm.JNE, asm.JGT: asm.JLE, asm.JGE: asm.JLT}

_VALID = {
    C_LD | S_W | M_IMM, C_LD | S_W | M_ABS, C_LD | S_H | M_ABS, C_LD | S_B | M_ABS,
    C_LD | S_W | M_IND, C_LD | S_H | M_IND, C_LD | S_B | M_IND, C_LD | S_W | M_MEM, C_LD | S_W | M_LEN,
    C_LDX | S_W | M_IMM, C_LDX | S_W | M_MEM, C_LDX | S_W | M_LEN, C_LDX | S_B | M_MSH,
    C_ST, C_STX,
    *(C_ALU | op | src for op in _ALU_OPS if op != 0x80 for src in (SRC_K, SRC_X)), C_ALU | 0x80,
    C_JMP | J_JA, *(C_JMP | op | src for op in _JMP_OPS for src in (SRC_K, SRC_X)),
    C_RET | SRC_K, C_RET | RVAL_A, C_MISC | MISC_TAX, C_MISC | MISC_TXA,
}

# Linux's negative ancillary offsets (SKF_LL_OFF = -0x200000 .. SKF_AD_OFF = -0x1000 .. -1): not a packet byte.
_ANCILLARY_FROM = (1 << 32) - 0x200000
_BIG = 0x7FFFFFFF   # offsets past this are never in a packet (packets are shorter than 2 GiB)
_INF = 1 << 40

# eBPF registers of the translated program (all caller-saved: the model lives in R6..R9).
_A, _X, _T = R0, R1, R2
# liveness bits: A, X, M[0..15]
_LA, _LX = 1, 2


def _lm(i: int) -> int:
    return 4 << i


def validate(insns: Sequence[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:  # noqa: C901 - one check per cBPF instruction class
    """Check a cBPF program (opcodes, jump targets, M[] indexes, constant divisors, final RET) and return it
    normalized: ints, k as u32. Raises CBPFError."""
    prog: list[tuple[int, int, int, int]] = []
    n = len(insns)
    if n == 0:
        raise CBPFError("empty program")
    for i, ins in enumerate(insns):
        try:
            code, jt, jf, k = (int(v) for v in ins)
        except (TypeError, ValueError) as e:
            raise CBPFError(f"not a (code, jt, jf, k) tuple: {ins!r}", i) from e
        if code not in _VALID:
            raise CBPFError(f"invalid opcode {code:#x}", i)
        if not (0 <= jt <= 0xFF and 0 <= jf <= 0xFF):
            raise CBPFError(f"jump offsets {jt}/{jf} out of 0..255", i)
        if not -(1 << 31) <= k < (1 << 32):
            raise CBPFError(f"k {k} is not 32-bit", i)
        k &= 0xFFFFFFFF
        cls, mode = code & 7, code & 0xE0
        if code == C_JMP | J_JA and k >= 1 << 31:
            raise CBPFError(f"backward jump (k = {k - (1 << 32)}): cBPF jumps only forward (a loop, as libpcap's "
                            "protochain emits; Linux refuses it too)", i)
        if cls == C_JMP:
            targets = (i + 1 + k,) if code == C_JMP | J_JA else (i + 1 + jt, i + 1 + jf)
            if max(targets) >= n:
                raise CBPFError("jump past the end of the program", i)
        if ((cls in (C_LD, C_LDX) and mode == M_MEM) or cls in (C_ST, C_STX)) and k >= MEMWORDS:
            raise CBPFError(f"scratch memory index {k} ≥ {MEMWORDS}", i)
        if cls == C_ALU and code & 8 == SRC_K:
            op = code & 0xF0
            if op in (0x30, 0x90) and k == 0:
                raise CBPFError("division by constant 0", i)
            if op in (0x60, 0x70) and k >= 32:
                raise CBPFError(f"shift by constant {k} ≥ 32", i)
        if cls in (C_LD, C_LDX) and mode in (M_ABS, M_IND, M_MSH) and k >= _ANCILLARY_FROM:
            raise CBPFError(f"unsupported: Linux ancillary/negative-offset load (k = {k - (1 << 32)})", i)
        prog.append((code, jt, jf, k))
    if prog[-1][0] & 7 != C_RET:
        raise CBPFError("the last instruction is not a RET", n - 1)
    return prog


# ---- analyses ------------------------------------------------------------------------------------

def _load_end(code: int, k: int) -> int | None:
    """End offset (k + size) of a constant-offset packet load, else None."""
    if code & 7 == C_LD and code & 0xE0 == M_ABS:
        return k + SIZE[code & 0x18]
    if code == C_LDX | S_B | M_MSH:
        return k + 1
    return None


class _Plan:
    """What the analyses found: reachable insns, successors, jump targets, liveness, packet guards."""

    def __init__(self, prog: list[tuple[int, int, int, int]], limit: int):
        n = len(prog)
        self.prog, self.limit = prog, limit
        self.succ: list[tuple[int, ...]] = []
        for i, (code, jt, jf, k) in enumerate(prog):
            cls = code & 7
            if cls == C_RET or self.always_rejects(i):
                self.succ.append(())
            elif cls == C_JMP:
                self.succ.append((i + 1 + k,) if code == C_JMP | J_JA else (i + 1 + jt, i + 1 + jf))
            else:
                self.succ.append((i + 1,))
        self.reach = [False] * n
        self.reach[0] = True
        for i in range(n):  # every jump goes forward: one pass in order
            if self.reach[i]:
                for s in self.succ[i]:
                    self.reach[s] = True
        self.targets = {s for i in range(n) if self.reach[i] and prog[i][0] & 7 == C_JMP for s in self.succ[i]}
        self._liveness()
        self._guards()
        self._raw_loads()

    def always_rejects(self, i: int) -> bool:
        code, _, _, k = self.prog[i]
        if code & 7 == C_LD and code & 0xE0 in (M_ABS, M_IND):
            return k + SIZE[code & 0x18] > self.limit
        if code == C_LDX | S_B | M_MSH:
            return k + 1 > self.limit
        return False

    def _liveness(self) -> None:
        n = len(self.prog)
        self.live_in = [0] * n
        self.live_out = [0] * n
        self.mem_used = 0
        for i in range(n - 1, -1, -1):
            code, _, _, k = self.prog[i]
            cls, mode = code & 7, code & 0xE0
            use = dfn = 0
            if cls == C_LD:
                dfn = _LA
                use = _LX if mode == M_IND else _lm(k) if mode == M_MEM else 0
            elif cls == C_LDX:
                dfn = _LX
                use = _lm(k) if mode == M_MEM else 0
            elif cls in (C_ST, C_STX):
                use, dfn = (_LA if cls == C_ST else _LX), _lm(k)
            elif cls == C_ALU:
                use, dfn = _LA | (_LX if code & 8 else 0), _LA
            elif cls == C_JMP:
                use = 0 if code == C_JMP | J_JA else _LA | (_LX if code & 8 else 0)
            elif cls == C_RET:
                use = _LA if code & 0x18 == RVAL_A else 0
            else:
                use, dfn = (_LA, _LX) if code & 0xF8 == MISC_TAX else (_LX, _LA)
            if (cls in (C_LD, C_LDX) and mode == M_MEM) or cls in (C_ST, C_STX):
                self.mem_used |= 1 << k
            out = 0
            for s in self.succ[i]:
                out |= self.live_in[s]
            self.live_out[i] = out
            self.live_in[i] = use | (out & ~dfn)

    def _guards(self) -> None:
        """Hoisted packet-length checks. need[i]: every path from i returns 0 or loads a byte at or past need[i]
        before returning, so `if buflen < need[i]: return 0` at i changes nothing. far[i]: the largest end of a
        constant-offset load reachable from i. A guard at a block start covers the block's loads."""
        n = len(self.prog)
        need = [0] * n
        far = [0] * n
        for i in range(n - 1, -1, -1):
            code, _, _, k = self.prog[i]
            if code & 7 == C_RET:
                need[i] = _INF if code == C_RET | SRC_K and k == 0 else 0
                continue
            if self.always_rejects(i):
                need[i] = _INF
                continue
            succ = self.succ[i]
            need[i] = min(need[s] for s in succ)
            far[i] = max(far[s] for s in succ)
            end = _load_end(code, k)
            if end is not None:
                need[i] = max(need[i], end)
                far[i] = max(far[i], end)
        self.guard: dict[int, int] = {}
        have = [-1] * n   # length already checked on every path into i (-1: not reached yet)
        have[0] = 0
        for i in range(n):
            if not self.reach[i]:
                continue
            g = min(need[i], far[i])
            if g > have[i] and (i == 0 or i in self.targets):  # need[] only grows across a jump
                self.guard[i] = g
                have[i] = g
            end = _load_end(self.prog[i][0], self.prog[i][3])
            assert end is None or end <= have[i] or self.always_rejects(i), (i, end, have[i])
            for s in self.succ[i]:
                have[s] = have[i] if have[s] < 0 else min(have[s], have[i])

    def _raw_loads(self) -> None:  # noqa: C901 - a data-flow pass over every instruction class
        """Halfword/word loads whose value only meets JEQ/JSET against constants are left in memory (big-endian)
        order and the constants swapped instead: one byte swap less per load. raw[i] = size for such loads;
        swapped[j] = size for the jumps that compare them."""
        n, prog = len(self.prog), self.prog
        reach_defs: list[frozenset] = [frozenset()] * n   # which insns' A values may reach i (-1: the initial A)
        seen = [False] * n
        seen[0], reach_defs[0] = True, frozenset([-1])
        cand: dict[int, int] = {}
        uses: list[int] = []
        for i in range(n):
            if not self.reach[i]:
                continue
            code, _, _, _ = prog[i]
            cls, mode = code & 7, code & 0xE0
            if cls == C_LD and mode in (M_ABS, M_IND) and code & 0x18 != S_B and not self.always_rejects(i):
                cand[i] = SIZE[code & 0x18]
            defines = cls == C_LD or cls == C_ALU or code == C_MISC | MISC_TXA
            if cls in (C_ST, C_ALU) or code in (C_RET | RVAL_A, C_MISC | MISC_TAX) or (
                    cls == C_JMP and code != C_JMP | J_JA):
                uses.append(i)
            out = frozenset([i]) if defines else reach_defs[i]
            for s in self.succ[i]:
                reach_defs[s] = reach_defs[s] | out if seen[s] else out
                seen[s] = True
        for j in uses:
            code = prog[j][0]
            ok = code in (C_JMP | J_JEQ | SRC_K, C_JMP | J_JSET | SRC_K)
            defs = reach_defs[j]
            if not ok or any(d not in cand for d in defs) or len({cand[d] for d in defs}) > 1:
                for d in defs:
                    cand.pop(d, None)
        changed = True
        while changed:  # a jump keeps swapped constants only if every value reaching it stayed raw
            changed = False
            for j in uses:
                defs = reach_defs[j]
                if any(d in cand for d in defs) and not all(d in cand for d in defs):
                    for d in defs:
                        cand.pop(d, None)
                    changed = True
        self.raw = cand
        self.swapped = {j: cand[next(iter(reach_defs[j]))] for j in uses
                        if prog[j][0] & 7 == C_JMP and reach_defs[j] and all(d in cand for d in reach_defs[j])}


def _swap_const(k: int, size: int, op: int) -> int:
    """The constant to compare a raw (memory-order) `size`-byte load with, for JEQ or JSET."""
    if size == 4:
        return int.from_bytes(k.to_bytes(4, "big"), "little")
    if k > 0xFFFF and op == J_JEQ:
        return k  # never equal to a 16-bit value, swapped or not
    return int.from_bytes((k & 0xFFFF).to_bytes(2, "big"), "little")


# ---- translation ---------------------------------------------------------------------------------

def translate(insns: Sequence[tuple[int, int, int, int]], model: PacketModel, *, result: int = R0,
              done: str = "cbpf_done", prefix: str = "cbpf", stack_off: int = -64) -> list[asm.Item]:
    """eBPF items that run the cBPF program: on every RET the returned value (u32) is left in register
    `result` and control jumps to label `done` (the caller places it after these items). A load outside the
    packet (offset + size > buflen) returns 0, as cBPF does; so does division by X == 0. Labels start with
    `prefix`, so several translations can share a program. Registers R0-R5 are clobbered; R6-R9 other than
    the model's are left alone. cBPF's scratch memory M[0..15] lives at [FP+stack_off, FP+stack_off+64); when
    slow_load is given and the program uses all 16 words, 8 more bytes at FP+stack_off-8 hold a spill."""
    prog = validate(insns)
    regs = (model.buf, model.buflen, model.wirelen)
    if any(r not in (R6, R7, R8, R9) for r in regs) or model.buf in (model.buflen, model.wirelen):
        raise ValueError(f"packet model registers {regs} must be R6..R9, buf distinct")
    if not 0 < model.capacity <= _BIG:
        raise ValueError(f"capacity {model.capacity} out of range")
    if not 0 <= result <= R9:
        raise ValueError(f"result register r{result} is not R0..R9")
    if stack_off % 8 or not -512 <= stack_off <= -4 * MEMWORDS:
        raise ValueError(f"stack_off {stack_off} must be a multiple of 8 in [-512, -64]")
    return _Emitter(prog, model, result, done, prefix, stack_off).run()


class _Emitter:
    def __init__(self, prog, model: PacketModel, result: int, done: str, prefix: str, stack_off: int):
        self.m, self.result, self.done, self.prefix, self.stack_off = model, result, done, prefix, stack_off
        self.plan = _Plan(prog, _BIG if model.slow_load else model.capacity)
        self.prog = prog
        self.out: list[asm.Item] = []
        self.reject_used = False
        free = [i for i in range(MEMWORDS) if not self.plan.mem_used >> i & 1]
        self.spill = stack_off + 4 * free[0] if free else stack_off - 8

    # labels
    def lbl(self, i: int) -> str:
        return f"{self.prefix}_{i}"

    @property
    def reject(self) -> str:
        self.reject_used = True
        return f"{self.prefix}_reject"

    def emit(self, *items: asm.Item) -> None:
        self.out.extend(items)

    def mem(self, k: int) -> int:
        return self.stack_off + 4 * k

    def run(self) -> list[asm.Item]:
        plan = self.plan
        live0 = plan.live_in[0]
        if live0 & _LA:
            self.emit(asm.alu32(asm.MOV, _A, 0))
        if live0 & _LX:
            self.emit(asm.alu32(asm.MOV, _X, 0))
        for j in range(MEMWORDS):
            if live0 & _lm(j):
                self.emit(asm.st(W, FP, self.mem(j), 0))
        reachable = [i for i in range(len(self.prog)) if plan.reach[i]]
        for pos, i in enumerate(reachable):
            nxt = reachable[pos + 1] if pos + 1 < len(reachable) else None
            if i in plan.targets:
                self.emit(asm.label(self.lbl(i)))
            if i in plan.guard:
                self.emit(asm.jmp(asm.JLT, self.m.buflen, plan.guard[i], self.reject))
            self.insn(i, nxt)
        if self.reject_used:
            self.emit(asm.label(f"{self.prefix}_reject"), asm.alu32(asm.MOV, self.result, 0))
        return _peephole(self.out, self.done)

    def insn(self, i: int, nxt: int | None) -> None:  # noqa: C901 - the dispatch: one branch per cBPF instruction class
        code, jt, jf, k = self.prog[i]
        cls, mode = code & 7, code & 0xE0
        if self.plan.always_rejects(i):
            self.emit(asm.ja(self.reject))
        elif cls == C_LD:
            if mode == M_ABS:
                self.load_abs(i, SIZE[code & 0x18], k)
            elif mode == M_IND:
                self.load_ind(i, SIZE[code & 0x18], k)
            elif mode == M_MEM:
                self.emit(asm.ldx(W, _A, FP, self.mem(k)))
            elif mode == M_LEN:
                self.emit(asm.mov32(_A, self.m.wirelen))
            else:
                self.emit(asm.alu32(asm.MOV, _A, k))
        elif cls == C_LDX:
            if mode == M_MSH:
                self.load_msh(i, k)
            elif mode == M_MEM:
                self.emit(asm.ldx(W, _X, FP, self.mem(k)))
            elif mode == M_LEN:
                self.emit(asm.mov32(_X, self.m.wirelen))
            else:
                self.emit(asm.alu32(asm.MOV, _X, k))
        elif cls == C_ST:
            self.emit(asm.stx(W, FP, self.mem(k), _A))
        elif cls == C_STX:
            self.emit(asm.stx(W, FP, self.mem(k), _X))
        elif cls == C_ALU:
            self.alu(i, code, k)
        elif cls == C_JMP:
            self.jump(i, code, jt, jf, k, nxt)
        elif cls == C_RET:
            if code & 0x18 == RVAL_A:
                if self.result != _A:
                    self.emit(asm.mov32(self.result, _A))
            else:
                self.emit(asm.alu32(asm.MOV, self.result, k))
            self.emit(asm.ja(self.done))
        elif code & 0xF8 == MISC_TAX:
            self.emit(asm.mov32(_X, _A))
        else:
            self.emit(asm.mov32(_A, _X))

    def alu(self, i: int, code: int, k: int) -> None:
        op = _ALU_OPS[code & 0xF0]
        if op == asm.NEG:
            self.emit(asm.alu32(asm.NEG, _A, 0))
        elif code & 8 == SRC_K:
            self.emit(asm.alu32(op, _A, k))
        elif op in (asm.DIV, asm.MOD):
            self.emit(asm.jmp32(asm.JEQ, _X, 0, self.reject), asm.alu32(op, _A, _X, reg=True))
        elif op in (asm.LSH, asm.RSH):  # libpcap: a shift by 32 or more gives 0 (eBPF would take the count mod 32)
            big, end = f"{self.prefix}_{i}_shift32", f"{self.prefix}_{i}_shifted"
            self.emit(asm.jmp32(asm.JGE, _X, 32, big), asm.alu32(op, _A, _X, reg=True), asm.ja(end),
                      asm.label(big), asm.alu32(asm.MOV, _A, 0), asm.label(end))
        else:
            self.emit(asm.alu32(op, _A, _X, reg=True))

    def jump(self, i: int, code: int, jt: int, jf: int, k: int, nxt: int | None) -> None:
        if code == C_JMP | J_JA:
            if i + 1 + k != nxt:
                self.emit(asm.ja(self.lbl(i + 1 + k)))
            return
        t, f = i + 1 + jt, i + 1 + jf
        op = _JMP_OPS[code & 0xF0]
        reg = bool(code & 8)
        val = _X if reg else k
        if i in self.plan.swapped:
            val = _swap_const(k, self.plan.swapped[i], code & 0xF0)
        if t == f:
            if t != nxt:
                self.emit(asm.ja(self.lbl(t)))
        elif f == nxt:
            self.emit(asm.jmp32(op, _A, val, self.lbl(t), reg=reg))
        elif t == nxt and op in _NEGATED:
            self.emit(asm.jmp32(_NEGATED[op], _A, val, self.lbl(f), reg=reg))
        else:
            self.emit(asm.jmp32(op, _A, val, self.lbl(t), reg=reg), asm.ja(self.lbl(f)))

    # ---- packet loads ----

    def _ldx_buf(self, size: int, dst: int, k: int) -> None:
        """dst = *(size *)(buf + k), constant k with k + size <= capacity."""
        if k <= 0x7FFF:
            self.emit(asm.ldx(_EBPF_SIZE[size], dst, self.m.buf, k))
        else:
            self.emit(asm.mov(_T, self.m.buf), asm.addi(_T, k), asm.ldx(_EBPF_SIZE[size], dst, _T, 0))

    def _slow(self, i: int, size: int, dst: int, keep: int) -> None:
        """slow_load(size, _T, dst): _T holds the offset; register `keep` is saved around it when live."""
        live = self.plan.live_out[i] & (_LA if keep == _A else _LX)
        if live:
            self.emit(asm.stx(W, FP, self.spill, keep))
        self.emit(*self.m.slow_load(size, _T, dst, self.reject))
        if live:
            self.emit(asm.ldx(W, keep, FP, self.spill))

    def _swap(self, i: int, size: int) -> None:
        if size > 1 and i not in self.plan.raw:
            self.emit(asm.be(_A, 8 * size))

    def load_abs(self, i: int, size: int, k: int) -> None:
        if k + size <= self.m.capacity:
            self._ldx_buf(size, _A, k)
        else:
            self.emit(asm.movi(_T, k))
            self._slow(i, size, _A, _X)
        self._swap(i, size)

    def load_msh(self, i: int, k: int) -> None:
        if k + 1 <= self.m.capacity:
            self._ldx_buf(1, _X, k)
        else:
            self.emit(asm.movi(_T, k))
            self._slow(i, 1, _X, _A)
        self.emit(asm.alu32(asm.AND, _X, 0xF), asm.alu32(asm.LSH, _X, 2))

    def load_ind(self, i: int, size: int, k: int) -> None:
        """A = P[X + k : size]. T = X + k + size (exact: X is a u32 in a 64-bit register, k + size < 2^31)."""
        cap, slow = self.m.capacity, self.m.slow_load is not None
        self.emit(asm.mov(_T, _X), asm.addi(_T, k + size),
                  asm.jmp(asm.JGT, _T, self.m.buflen, self.reject, reg=True))
        if cap < size + k:
            if not slow:  # cannot happen: always_rejects
                raise AssertionError("unreachable")
            self.emit(asm.addi(_T, -size))
            self._slow(i, size, _A, _X)
        else:
            slow_lbl, join = f"{self.prefix}_{i}_slow", f"{self.prefix}_{i}_join"
            self.emit(asm.jmp(asm.JGT, _T, cap, slow_lbl if slow else self.reject),
                      asm.mov(_A, self.m.buf), asm.add(_A, _T),
                      asm.ldx(_EBPF_SIZE[size], _A, _A, -size))
            if slow:
                self.emit(asm.ja(join), asm.label(slow_lbl), asm.addi(_T, -size))
                self._slow(i, size, _A, _X)
                self.emit(asm.label(join))
        self._swap(i, size)


def _peephole(items: list[asm.Item], done: str) -> list[asm.Item]:
    """Drop jumps to the very next instruction (a label, or the end where `done` follows)."""
    out: list[asm.Item] = []
    for pos, it in enumerate(items):
        if isinstance(it, asm.Insn) and it.op == asm.JMP | asm.JA and it.target is not None:
            j = pos + 1
            following = set()
            while j < len(items) and isinstance(items[j], asm.Label):
                following.add(items[j].name)
                j += 1
            if j == len(items):
                following.add(done)
            if it.target in following:
                continue
        out.append(it)
    return out



_ALU_NAMES = {0x00: "add", 0x10: "sub", 0x20: "mul", 0x30: "div", 0x40: "or", 0x50: "and", 0x60: "lsh",
              0x70: "rsh", 0x80: "neg", 0x90: "mod", 0xA0: "xor"}
_JMP_NAMES = {J_JEQ: "jeq", J_JGT: "jgt", J_JGE: "jge", J_JSET: "jset"}


def disassemble(insns: Sequence[tuple[int, int, int, int]]) -> str:
    """A listing in tcpdump -d style (libpcap's bpf_image), one instruction per line."""
    lines = []
    for i, (code, jt, jf, k) in enumerate(insns):
        code, k = int(code), int(k) & 0xFFFFFFFF
        cls, mode, size = code & 7, code & 0xE0, code & 0x18
        sk = k - (1 << 32) if k >= 1 << 31 else k   # libpcap prints %d of a u32
        sfx = {S_W: "", S_H: "h", S_B: "b"}.get(size, "?")
        op, arg = f"unimp {code:#x}", f"{k:#x}"
        if cls == C_LD and mode in (M_ABS, M_IND):
            op, arg = "ld" + sfx, f"[{sk}]" if mode == M_ABS else f"[x + {sk}]"
        elif cls in (C_LD, C_LDX) and mode in (M_IMM, M_MEM, M_LEN):
            op = "ld" if cls == C_LD else "ldx"
            arg = {M_IMM: f"#{k:#x}", M_MEM: f"M[{k}]", M_LEN: "#pktlen"}[mode]
        elif code == C_LDX | S_B | M_MSH:
            op, arg = "ldxb", f"4*([{sk}]&0xf)"
        elif cls in (C_ST, C_STX):
            op, arg = ("st" if cls == C_ST else "stx"), f"M[{k}]"
        elif cls == C_ALU and code & 0xF0 in _ALU_NAMES:
            op = _ALU_NAMES[code & 0xF0]
            hexa = op in ("and", "or", "xor")
            arg = "" if op == "neg" else "x" if code & 8 else f"#{k:#x}" if hexa else f"#{sk}"
        elif code == C_JMP | J_JA:
            op, arg = "ja", f"{i + 1 + k}"
        elif cls == C_JMP and code & 0xF0 in _JMP_NAMES:
            arg = "x" if code & 8 else f"#{k:#x}"
            lines.append(f"({i:03d}) {_JMP_NAMES[code & 0xF0]:<8} {arg:<16} jt {i + 1 + jt}\tjf {i + 1 + jf}")
            continue
        elif cls == C_RET:
            op, arg = "ret", "a" if code & 0x18 == RVAL_A else f"#{sk}"
        elif cls == C_MISC:
            op, arg = ("tax" if code & 0xF8 == MISC_TAX else "txa"), ""
        lines.append(f"({i:03d}) {op:<8} {arg}".rstrip())
    return "\n".join(lines)
