"""Classic BPF (cBPF) programs translated to eBPF, for packet bytes held in a buffer the verifier knows the size of."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from . import asm
from .asm import DW, FP, R0, R1, R2, R6, R7, R8, R9, B, H, W
from .cbpf_plan import (AD_FROM, AD_XOR_X, ALU_OPS, ANCILLARY, BIG, C_ALU, C_JMP, C_LD, C_LDX, C_MISC, C_RET, C_ST,
                        C_STX, J_JA, J_JEQ, J_JGE, J_JGT, J_JSET, JMP_OPS, LA, LX, M_ABS, M_IMM, M_IND, M_LEN, M_MEM,
                        M_MSH, MEMWORDS, MISC_TAX, NEGATIVE_FROM, RVAL_A, S_B, S_H, S_W, SIZE, SRC_K,
                        VALID, Analysis, ancillary_field, ja_target, lm)
from .errors import CBPFError

__all__ = ["ANCILLARY", "LOOP_BOUND", "MEMWORDS", "CBPFError", "PacketModel", "disassemble", "translate", "validate"]

# A backward jump (a loop: libpcap's protochain walks the IPv6 extension headers and IPv4 AH headers with one) is
# taken at most LOOP_BOUND times per run to each of its targets; the next one makes the program return 0 (no
# match). protochain takes one per extension header, so it follows chains of up to 16 headers (real ones have
# at most 8: RFC 8200's order lists 6 kinds, destination options twice). The verifier walks every iteration, of
# each loop (libpcap's run one after another); a loop inside a loop multiplies them (LOOP_BOUND^depth walks).
LOOP_BOUND = 16


SlowLoad = Callable[[int, int, int, str], list]
Ancillary = Callable[[int, int, str], list]


class PacketModel(NamedTuple):
    """How the translated program reaches packet bytes: the first `capacity` bytes sit in a buffer.

    buf: register (R6..R9) pointing at the packet's first byte (a map value or stack pointer whose size the verifier
      knows to be at least `capacity`).
    buflen: register (R6..R9) with the captured length that cBPF loads are checked against (u32 value). Without
      slow_load it must not exceed `capacity`; with slow_load it may (bytes past capacity come from slow_load).
      Its value is kept, but a program with loops makes the verifier forget what it knew of it.
    wirelen: register (R6..R9) with the packet's length on the wire (what BPF_LEN loads); may equal buflen.
    capacity: the buffer's size in bytes; a load reaching past it returns 0 (rejects) unless slow_load is given.
    slow_load(size, off_reg, dst, reject) -> items: code loading `size` (1/2/4) bytes at the offset in register
      off_reg into register dst (host order, zero-extended; the translator swaps bytes) or jumping to label
      `reject`; used for loads reaching past capacity. It may clobber R0-R5 (it may call helpers) and nothing else.
    ancillary(field, dst, reject) -> items: code loading Linux ancillary field `field` (SKF_AD_* number, see
      ANCILLARY: 4 = "pkttype", ...) into register dst as a u32, as Linux's socket filters see it, or jumping
      to label `reject` (no match). It may clobber R0-R5 and nothing else, and raises CBPFError for a field it
      cannot serve (the message names the field and why). Without it, programs with such loads are refused.
    division_tracked: the verifier tracks ranges through a division (bpf.probes.division_ranges() is None):
      loops then make it forget what it knew with an xor rather than a division (see _Emitter.widen).
    """

    buf: int
    buflen: int
    wirelen: int
    capacity: int
    slow_load: SlowLoad | None = None
    ancillary: Ancillary | None = None
    division_tracked: bool = False


_NEGATED = {asm.JEQ: asm.JNE, asm.JGT: asm.JLE, asm.JGE: asm.JLT}
_EBPF_SIZE = {4: W, 2: H, 1: B}
_VALID, _ALU_OPS = VALID, ALU_OPS   # (older names, used by tests)

# eBPF registers of the translated program (all caller-saved: the model lives in R6..R9).
_A, _X, _T = R0, R1, R2


def validate(insns: Sequence[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Check a cBPF program (opcodes, jump targets, M[] indexes, constant divisors, final RET) and return it
    normalized: ints, k as u32. Raises CBPFError."""
    n = len(insns)
    if n == 0:
        raise CBPFError("empty program")
    prog = [_check(i, ins, n) for i, ins in enumerate(insns)]
    if prog[-1][0] & 7 != C_RET:
        raise CBPFError("the last instruction is not a RET", n - 1)
    return prog


def _check(i: int, ins, n: int) -> tuple[int, int, int, int]:
    try:
        code, jt, jf, k = (int(v) for v in ins)
    except (TypeError, ValueError) as e:
        raise CBPFError(f"not a (code, jt, jf, k) tuple: {ins!r}", i) from e
    if code not in VALID:
        raise CBPFError(f"invalid opcode {code:#x}", i)
    if not (0 <= jt <= 0xFF and 0 <= jf <= 0xFF):
        raise CBPFError(f"jump offsets {jt}/{jf} out of 0..255", i)
    if not -(1 << 31) <= k < (1 << 32):
        raise CBPFError(f"k {k} is not 32-bit", i)
    k &= 0xFFFFFFFF
    _check_operands(i, code, jt, jf, k, n)
    return code, jt, jf, k


def _check_operands(i: int, code: int, jt: int, jf: int, k: int, n: int) -> None:
    """Jump targets, scratch indexes, constant divisors and shifts, ancillary fields, negative offsets."""
    cls, mode = code & 7, code & 0xE0
    if cls == C_JMP:
        targets = (ja_target(i, k),) if code == C_JMP | J_JA else (i + 1 + jt, i + 1 + jf)
        if max(targets) >= n:
            raise CBPFError("jump past the end of the program", i)
        if min(targets) < 0:
            raise CBPFError("jump before the start of the program", i)
    if ((cls in (C_LD, C_LDX) and mode == M_MEM) or cls in (C_ST, C_STX)) and k >= MEMWORDS:
        raise CBPFError(f"scratch memory index {k} ≥ {MEMWORDS}", i)
    if cls == C_ALU and code & 8 == SRC_K:
        op = code & 0xF0
        if op in (0x30, 0x90) and k == 0:
            raise CBPFError("division by constant 0", i)
        if op in (0x60, 0x70) and k >= 32:
            raise CBPFError(f"shift by constant {k} ≥ 32", i)
    field = ancillary_field(code, k)
    if field is not None and field not in ANCILLARY:
        raise CBPFError(f"unknown Linux ancillary field SKF_AD_OFF + {field}", i)
    if field is None and cls in (C_LD, C_LDX) and mode in (M_ABS, M_IND, M_MSH) and k >= NEGATIVE_FROM:
        raise CBPFError(f"unsupported: a load at a negative offset (k = {k - (1 << 32)}: Linux's SKF_NET_OFF / "
                        "SKF_LL_OFF, bytes relative to the network or link-layer header)", i)


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
    packet (offset + size > buflen) returns 0, as cBPF does; so does division by X == 0, and a backward jump
    taken more than LOOP_BOUND times to the same target. Linux ancillary loads (`ld [SKF_AD_OFF + n]`) come
    from model.ancillary (A ^= X for SKF_AD_ALU_XOR_X). Labels start with `prefix`, so several translations can
    share a program. Registers R0-R5 are clobbered; R6-R9 other than the model's are left alone. cBPF's scratch
    memory M[0..15] lives at [FP+stack_off, FP+stack_off+64); when slow_load or ancillary is given and the
    program uses all 16 words, 8 more bytes at FP+stack_off-8 hold a spill; loop j's counter (one per target of
    backward jumps) takes the 8 bytes at FP+stack_off-16-8j."""
    prog = validate(insns)
    regs = (model.buf, model.buflen, model.wirelen)
    if any(r not in (R6, R7, R8, R9) for r in regs) or model.buf in (model.buflen, model.wirelen):
        raise ValueError(f"packet model registers {regs} must be R6..R9, buf distinct")
    if not 0 < model.capacity <= BIG:
        raise ValueError(f"capacity {model.capacity} out of range")
    if not 0 <= result <= R9:
        raise ValueError(f"result register r{result} is not R0..R9")
    if stack_off % 8 or not -512 <= stack_off <= -4 * MEMWORDS:
        raise ValueError(f"stack_off {stack_off} must be a multiple of 8 in [-512, -64]")
    return _Emitter(prog, model, result, done, prefix, stack_off).run()


class _Emitter:
    def __init__(self, prog, model: PacketModel, result: int, done: str, prefix: str, stack_off: int):
        self.m, self.result, self.done, self.prefix, self.stack_off = model, result, done, prefix, stack_off
        self.plan = Analysis(prog, BIG if model.slow_load else model.capacity)
        self.prog = prog
        self.out: list[asm.Item] = []
        free = [i for i in range(MEMWORDS) if not self.plan.mem_used >> i & 1]
        self.spill = stack_off + 4 * free[0] if free else stack_off - 8
        self.counter = {h: stack_off - 16 - 8 * j for j, h in enumerate(self.plan.loops)}
        if self.counter and min(self.counter.values()) < -512:
            raise CBPFError(f"{len(self.counter)} loops (targets of backward jumps): at most "
                            f"{(stack_off + 504) // 8} fit in the stack here")

    # labels
    def lbl(self, i: int) -> str:
        return f"{self.prefix}_{i}"

    @property
    def reject(self) -> str:
        return f"{self.prefix}_reject"

    def emit(self, *items: asm.Item) -> None:
        self.out.extend(items)

    def mem(self, k: int) -> int:
        return self.stack_off + 4 * k

    def run(self) -> list[asm.Item]:
        plan = self.plan
        live0 = plan.live_in[0]
        if live0 & LA:
            self.emit(asm.alu32(asm.MOV, _A, 0))
        if live0 & LX:
            self.emit(asm.alu32(asm.MOV, _X, 0))
        for j in range(MEMWORDS):
            if live0 & lm(j):
                self.emit(asm.st(W, FP, self.mem(j), 0))
        for slot in self.counter.values():
            self.emit(asm.movi(_T, LOOP_BOUND), asm.stx(DW, FP, slot, _T))
        reachable = [i for i in range(len(self.prog)) if plan.reach[i]]
        for pos, i in enumerate(reachable):
            nxt = reachable[pos + 1] if pos + 1 < len(reachable) else None
            if i in plan.targets:
                self.emit(asm.label(self.lbl(i)))
            if i in plan.guard:
                self.emit(asm.jmp(asm.JLT, self.m.buflen, plan.guard[i], self.reject))
            self.insn(i, nxt)
        if any(isinstance(it, asm.Insn) and it.target == self.reject for it in self.out):
            self.emit(asm.label(f"{self.prefix}_reject"), asm.alu32(asm.MOV, self.result, 0))
        out = _peephole(self.out, self.done)
        return _jump_into_loops(out) if plan.loops else out

    def insn(self, i: int, nxt: int | None) -> None:  # noqa: C901 - the dispatch: one branch per cBPF instruction class
        code, jt, jf, k = self.prog[i]
        cls, mode = code & 7, code & 0xE0
        if self.plan.always_rejects(i):
            self.emit(asm.ja(self.reject))
        elif cls == C_LD:
            if ancillary_field(code, k) is not None:
                self.ancillary(i, k - AD_FROM)
            elif mode == M_ABS:
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
            t = ja_target(i, k)
            if t <= i:   # a loop: count the jumps back to t, give up (no match) past LOOP_BOUND
                slot = self.counter[t]
                self.emit(asm.ldx(DW, _T, FP, slot), asm.jmp(asm.JEQ, _T, 0, self.reject), asm.addi(_T, -1),
                          asm.stx(DW, FP, slot, _T))
                self.widen(self.plan.live_in[t])
                self.emit(asm.ja(self.lbl(t)))
            elif t != nxt:
                self.emit(asm.ja(self.lbl(t)))
            return
        t, f = i + 1 + jt, i + 1 + jf
        op = JMP_OPS[code & 0xF0]
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

    def widen(self, live: int) -> None:
        """Make the verifier forget what it knew of A, X, M[] (when live) and buflen without changing them, so
        the states at a loop head that differ only there are pruned; without it each iteration's offsets make new
        states, and verifying takes a million instructions for a few protochains. `w /= 1` does it where the
        verifier tracks no ranges through a division; where it does (Linux 7.0+: 'ip6 protochain 0' then took 36x
        the instructions to verify, a batch of them a million) they are xored with z, a word of the buffer xored
        with itself: 0, which the verifier does not know. (5.10's verifier loses a bound with the xor: each way
        where it serves.)"""
        regs = [reg for reg, bit in ((_A, LA), (_X, LX)) if live & bit] + [self.m.buflen]
        words = [j for j in range(MEMWORDS) if live & lm(j)]   # the scratch words read before they are written
        if not self.m.division_tracked:
            for reg in regs:   # (then `w = w`: a u32 again, for the verifier too)
                self.emit(asm.alu32(asm.DIV, reg, 1), asm.mov32(reg, reg))
            for j in words:
                self.emit(asm.ldx(W, _T, FP, self.mem(j)), asm.alu32(asm.DIV, _T, 1), asm.stx(W, FP, self.mem(j), _T))
            return
        z = asm.R3   # (free at a back edge: no call is under way)
        self.emit(asm.ldx(W, _T, self.m.buf, 0), asm.mov(z, _T), asm.alu64(asm.XOR, z, _T, reg=True))
        for reg in regs:
            self.emit(asm.alu64(asm.XOR, reg, z, reg=True))
        for j in words:
            self.emit(asm.ldx(W, _T, FP, self.mem(j)), asm.alu64(asm.XOR, _T, z, reg=True),
                      asm.stx(W, FP, self.mem(j), _T))

    # ---- packet loads ----

    def _ldx_buf(self, size: int, dst: int, k: int) -> None:
        """dst = *(size *)(buf + k), constant k with k + size <= capacity."""
        if k <= 0x7FFF:
            self.emit(asm.ldx(_EBPF_SIZE[size], dst, self.m.buf, k))
        else:
            self.emit(asm.mov(_T, self.m.buf), asm.addi(_T, k), asm.ldx(_EBPF_SIZE[size], dst, _T, 0))

    def _slow(self, i: int, size: int, dst: int, keep: int) -> None:
        """slow_load(size, _T, dst): _T holds the offset; register `keep` is saved around it when live."""
        self._keeping(i, keep, self.m.slow_load(size, _T, dst, self.reject))

    def _keeping(self, i: int, keep: int, items: list) -> None:
        """items (model code that may clobber R0-R5), with register `keep` saved around them when live."""
        live = self.plan.live_out[i] & (LA if keep == _A else LX)
        if live:
            self.emit(asm.stx(W, FP, self.spill, keep))
        self.emit(*items)
        if live:
            self.emit(asm.ldx(W, keep, FP, self.spill))

    def ancillary(self, i: int, field: int) -> None:
        """A = Linux ancillary field `field` (the model's code), or A ^= X."""
        if field == AD_XOR_X:
            self.emit(asm.alu32(asm.XOR, _A, _X, reg=True))
            return
        name = ANCILLARY[field]
        if self.m.ancillary is None:
            raise CBPFError(f"Linux ancillary field {name} (SKF_AD_OFF + {field}): this packet source has no "
                            "socket buffer to read it from", i)
        try:
            items = self.m.ancillary(field, _A, self.reject)
        except CBPFError as e:
            raise CBPFError(str(e), i) from None
        self._keeping(i, _X, items)

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


def _jump_into_loops(items: list[asm.Item]) -> list[asm.Item]:
    """6.1's verifier (check_cfg) refuses a loop that a fall-through closes in its depth-first walk (an
    instruction other than a jump running on into a label already on the walk's path): before such a label, a
    jump to it (`goto +0`), until there is none."""
    while True:
        bad = _fall_throughs_closing_loops(items)
        if not bad:
            return items
        out: list[asm.Item] = []
        for pos, it in enumerate(items):
            if pos in bad:
                out.append(asm.ja(bad[pos]))
            out.append(it)
        items = out


def _fall_throughs_closing_loops(items: list[asm.Item]) -> dict[int, str]:
    """{position of the labels before an instruction: one of them} for each instruction the walk the kernel makes
    (successors in order: fall-through, then jump target) reaches first by a jump and later by falling into it
    from a non-jump instruction while it is still on the path."""
    nodes = [it for it in items if isinstance(it, asm.Insn)]
    at: dict[str, int] = {}
    before: dict[int, tuple[int, str]] = {}
    k = 0
    for pos, it in enumerate(items):
        if isinstance(it, asm.Label):
            at[it.name] = k
            before.setdefault(k, (pos, it.name))
        k += isinstance(it, asm.Insn)   # (annotations, asm.Holds, take no slot either)

    def succ(k: int) -> list[tuple[int | None, bool]]:   # (next node or None: out of the fragment, a loop may close)
        ins = nodes[k]
        if ins.op & 7 not in (asm.JMP, asm.JMP32):
            return [(k + 1, False)]
        op = ins.op & 0xF0
        if op == asm.EXIT:
            return []
        if op == asm.CALL:
            return [(k + 1, False)]
        target = (at.get(ins.target), True)
        return [target] if op == asm.JA and ins.op & 7 == asm.JMP else [(k + 1, True), target]

    state = [0] * len(nodes)   # 0 not seen, 1 on the path, 2 done
    bad: dict[int, str] = {}
    state[0], path = 1, [(0, iter(succ(0)))]
    while path:
        k, todo = path[-1]
        for w, loop_ok in todo:
            if w is None or w >= len(nodes):
                continue
            if state[w] == 0:
                state[w] = 1
                path.append((w, iter(succ(w))))
                break
            if state[w] == 1 and not loop_ok:
                bad[before[w][0]] = before[w][1]
        else:
            state[k] = 2
            path.pop()
    return bad


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
            t = (i + 1 + k) & 0xFFFFFFFF   # as libpcap prints it: a backward jump's target, not a u32 sum
            op, arg = "ja", f"{t - (1 << 32) if t >= 1 << 31 else t}"
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
