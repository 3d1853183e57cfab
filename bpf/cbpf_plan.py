"""Classic BPF encoding, and the analyses bpf.cbpf's translation rests on: reachability, loops, liveness, hoisted
packet-length checks, and loads that can stay in network byte order."""

from __future__ import annotations

from . import asm

C_LD, C_LDX, C_ST, C_STX, C_ALU, C_JMP, C_RET, C_MISC = range(8)
S_W, S_H, S_B = 0x00, 0x08, 0x10
M_IMM, M_ABS, M_IND, M_MEM, M_LEN, M_MSH = 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0
SRC_K, SRC_X, RVAL_A = 0x00, 0x08, 0x10
J_JA, J_JEQ, J_JGT, J_JGE, J_JSET = 0x00, 0x10, 0x20, 0x30, 0x40
MISC_TAX, MISC_TXA = 0x00, 0x80
MEMWORDS = 16
SIZE = {S_W: 4, S_H: 2, S_B: 1}
ALU_OPS = {0x00: asm.ADD, 0x10: asm.SUB, 0x20: asm.MUL, 0x30: asm.DIV, 0x40: asm.OR, 0x50: asm.AND,
           0x60: asm.LSH, 0x70: asm.RSH, 0x80: asm.NEG, 0x90: asm.MOD, 0xA0: asm.XOR}
JMP_OPS = {J_JEQ: asm.JEQ, J_JGT: asm.JGT, J_JGE: asm.JGE, J_JSET: asm.JSET}

VALID = {
    C_LD | S_W | M_IMM, C_LD | S_W | M_ABS, C_LD | S_H | M_ABS, C_LD | S_B | M_ABS,
    C_LD | S_W | M_IND, C_LD | S_H | M_IND, C_LD | S_B | M_IND, C_LD | S_W | M_MEM, C_LD | S_W | M_LEN,
    C_LDX | S_W | M_IMM, C_LDX | S_W | M_MEM, C_LDX | S_W | M_LEN, C_LDX | S_B | M_MSH,
    C_ST, C_STX,
    *(C_ALU | op | src for op in ALU_OPS if op != 0x80 for src in (SRC_K, SRC_X)), C_ALU | 0x80,
    C_JMP | J_JA, *(C_JMP | op | src for op in JMP_OPS for src in (SRC_K, SRC_X)),
    C_RET | SRC_K, C_RET | RVAL_A, C_MISC | MISC_TAX, C_MISC | MISC_TXA,
}

# Linux's negative offsets: SKF_LL_OFF = -0x200000 and SKF_NET_OFF = -0x100000 (bytes relative to the link and
# network headers), SKF_AD_OFF = -0x1000 (ancillary fields: `ld{,h,b} [SKF_AD_OFF + n]` loads field n whole,
# whatever the load's size). Never a packet byte.
NEGATIVE_FROM = (1 << 32) - 0x200000
AD_FROM = (1 << 32) - 0x1000
ANCILLARY = {0: "protocol", 4: "pkttype", 8: "ifindex", 12: "mark", 16: "queue", 20: "nlattr",
             24: "nlattr_nest", 28: "hatype", 32: "rxhash", 36: "cpu", 40: "alu_xor_x", 44: "vlan_tag",
             48: "vlan_tag_present", 52: "pay_offset", 56: "random", 60: "vlan_tpid"}
AD_XOR_X = 40     # not a load: A ^= X
BIG = 0x7FFFFFFF  # offsets past this are never in a packet (packets are shorter than 2 GiB)
_INF = 1 << 40

# liveness bits: A, X, M[0..15]
LA, LX = 1, 2


def lm(i: int) -> int:
    return 4 << i


def ancillary_field(code: int, k: int) -> int | None:
    """n of a Linux ancillary load `ld{,h,b} [SKF_AD_OFF + n]`, else None."""
    if code & 7 == C_LD and code & 0xE0 == M_ABS and k >= AD_FROM:
        return k - AD_FROM
    return None


def ja_target(i: int, k: int) -> int:
    """Where `ja k` at i goes: k is added as a u32 to the pc, so k >= 2^31 jumps back."""
    return i + 1 + (k - (1 << 32) if k >= 1 << 31 else k)


def load_end(code: int, k: int) -> int | None:
    """End offset (k + size) of a constant-offset packet load, else None."""
    if code & 7 == C_LD and code & 0xE0 == M_ABS and k < AD_FROM:
        return k + SIZE[code & 0x18]
    if code == C_LDX | S_B | M_MSH:
        return k + 1
    return None


class Analysis:
    """What the analyses found: reachable insns, successors, jump targets, loop heads (targets of backward
    jumps), liveness, packet guards, loads kept in network order."""

    def __init__(self, prog: list[tuple[int, int, int, int]], limit: int):
        n = len(prog)
        self.prog, self.limit = prog, limit
        self.succ: list[tuple[int, ...]] = []
        for i, (code, jt, jf, k) in enumerate(prog):
            cls = code & 7
            if cls == C_RET or self.always_rejects(i):
                self.succ.append(())
            elif cls == C_JMP:
                self.succ.append((ja_target(i, k),) if code == C_JMP | J_JA else (i + 1 + jt, i + 1 + jf))
            else:
                self.succ.append((i + 1,))
        self.reach = [False] * n
        self.reach[0] = True
        todo = [0]
        while todo:
            for s in self.succ[todo.pop()]:
                if not self.reach[s]:
                    self.reach[s] = True
                    todo.append(s)
        live = [i for i in range(n) if self.reach[i]]
        self.loops = sorted({s for i in live for s in self.succ[i] if s <= i})
        self.targets = {s for i in live if prog[i][0] & 7 == C_JMP for s in self.succ[i]}
        self._liveness()
        self._guards()
        self._raw_loads()

    def always_rejects(self, i: int) -> bool:
        code, _, _, k = self.prog[i]
        if code & 7 == C_LD and code & 0xE0 in (M_ABS, M_IND):
            return k + SIZE[code & 0x18] > self.limit and ancillary_field(code, k) is None
        if code == C_LDX | S_B | M_MSH:
            return k + 1 > self.limit
        return False

    def _use_def(self, i: int) -> tuple[int, int]:
        code, _, _, k = self.prog[i]
        cls, mode = code & 7, code & 0xE0
        if cls == C_LD:
            if ancillary_field(code, k) == AD_XOR_X:
                return LA | LX, LA
            return (LX if mode == M_IND else lm(k) if mode == M_MEM else 0), LA
        if cls == C_LDX:
            return (lm(k) if mode == M_MEM else 0), LX
        if cls in (C_ST, C_STX):
            return (LA if cls == C_ST else LX), lm(k)
        if cls == C_ALU:
            return LA | (LX if code & 8 else 0), LA
        if cls == C_JMP:
            return (0 if code == C_JMP | J_JA else LA | (LX if code & 8 else 0)), 0
        if cls == C_RET:
            return (LA if code & 0x18 == RVAL_A else 0), 0
        return (LA, LX) if code & 0xF8 == MISC_TAX else (LX, LA)

    def _liveness(self) -> None:
        """live_in/live_out per insn (bits LA, LX, lm(k)); a backward pass, repeated until stable when there
        are loops."""
        n = len(self.prog)
        self.live_in = [0] * n
        self.live_out = [0] * n
        self.mem_used = 0
        use_def = [self._use_def(i) for i in range(n)]
        for i, (code, _, _, k) in enumerate(self.prog):
            if ((code & 7) in (C_LD, C_LDX) and code & 0xE0 == M_MEM) or code & 7 in (C_ST, C_STX):
                self.mem_used |= 1 << k
        changed = True
        while changed:
            changed = False
            for i in range(n - 1, -1, -1):
                use, dfn = use_def[i]
                out = 0
                for s in self.succ[i]:
                    out |= self.live_in[s]
                new = use | (out & ~dfn)
                if new != self.live_in[i] or out != self.live_out[i]:
                    self.live_in[i], self.live_out[i] = new, out
                    changed = True
            changed = changed and bool(self.loops)

    def _guards(self) -> None:
        """Hoisted packet-length checks. need[i]: every path from i returns 0 or loads a byte at or past need[i]
        before returning, so `if buflen < need[i]: return 0` at i changes nothing. far[i]: the largest end of a
        constant-offset load reachable from i. A guard at a block start covers the block's loads. A backward
        jump counts as needing nothing, and a loop head starts with nothing checked."""
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
            need[i] = min(need[s] if s > i else 0 for s in succ)
            far[i] = max(far[s] if s > i else 0 for s in succ)
            end = load_end(code, k)
            if end is not None:
                need[i] = max(need[i], end)
                far[i] = max(far[i], end)
        self.guard: dict[int, int] = {}
        have = [-1] * n   # length already checked on every path into i (-1: not reached yet)
        have[0] = 0
        for h in self.loops:
            have[h] = 0
        for i in range(n):
            if not self.reach[i]:
                continue
            g = min(need[i], far[i])
            if g > have[i] and (i == 0 or i in self.targets):  # need[] only grows across a fallthrough
                self.guard[i] = g
                have[i] = g
            end = load_end(self.prog[i][0], self.prog[i][3])
            assert end is None or end <= have[i] or self.always_rejects(i), (i, end, have[i])
            for s in self.succ[i]:
                have[s] = have[i] if have[s] < 0 else min(have[s], have[i])

    def _raw_loads(self) -> None:  # noqa: C901 - a data-flow pass over every instruction class
        """Halfword/word loads whose value only meets JEQ/JSET against constants are left in memory (big-endian)
        order and the constants swapped instead: one byte swap less per load. raw[i] = size for such loads;
        swapped[j] = size for the jumps that compare them."""
        n, prog = len(self.prog), self.prog
        cand: dict[int, int] = {}
        uses: list[int] = []
        for i in range(n):
            if not self.reach[i]:
                continue
            code, _, _, k = prog[i]
            cls, mode = code & 7, code & 0xE0
            anc = ancillary_field(code, k)
            if cls == C_LD and mode in (M_ABS, M_IND) and code & 0x18 != S_B and not self.always_rejects(i) \
                    and anc is None:
                cand[i] = SIZE[code & 0x18]
            if cls in (C_ST, C_ALU) or code in (C_RET | RVAL_A, C_MISC | MISC_TAX) or anc == AD_XOR_X or (
                    cls == C_JMP and code != C_JMP | J_JA):
                uses.append(i)
        reach_defs = self._reaching_defs()
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

    def _reaching_defs(self) -> list[frozenset]:
        """Which insns' A values may reach each insn (-1: the initial A); forward passes until stable."""
        n, prog = len(self.prog), self.prog
        reach_defs: list[frozenset] = [frozenset()] * n
        seen = [False] * n
        seen[0], reach_defs[0] = True, frozenset([-1])
        changed = True
        while changed:
            changed = False
            for i in range(n):
                if not (self.reach[i] and seen[i]):
                    continue
                code = prog[i][0]
                defines = code & 7 in (C_LD, C_ALU) or code == C_MISC | MISC_TXA
                out = frozenset([i]) if defines else reach_defs[i]
                for s in self.succ[i]:
                    new = reach_defs[s] | out if seen[s] else out
                    if not seen[s] or new != reach_defs[s]:
                        reach_defs[s], seen[s] = new, True
                        changed = True
            changed = changed and bool(self.loops)
        return reach_defs
