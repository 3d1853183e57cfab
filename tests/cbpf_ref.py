"""The reference cBPF interpreter of the tests: libpcap's bpf_filter(), instruction by instruction, with Linux's
ancillary loads and a bound on backward jumps (bpf.cbpf's loops)."""

from __future__ import annotations

from bpf import cbpf


M32 = 0xFFFFFFFF
AD_FROM = (1 << 32) - 0x1000   # SKF_AD_OFF as a u32


def run_cbpf(prog, pkt: bytes, wirelen: int | None = None, aux: dict | None = None,  # noqa: C901 - the reference interpreter: one branch per instruction class
             bound: int | None = cbpf.LOOP_BOUND, stats: dict | None = None) -> int:
    """libpcap's bpf_filter semantics: u32 arithmetic, a load past the captured bytes returns 0, so does
    division or modulo by X == 0, shifts by X ≥ 32 give 0; A, X and M[] start at 0. Linux's on top: `ld
    [SKF_AD_OFF + n]` loads aux[n] (SKF_AD_ALU_XOR_X: A ^= X). fcap's: the bound-th + 1 backward jump to the
    same target returns 0 (bound None: libpcap's, no bound); stats["back"]: the most jumps back to one target,
    stats["cycle"]: the program came back to a state it had been in at a jump back (it returns 0 then)."""
    buflen = len(pkt)
    wirelen = buflen if wirelen is None else wirelen
    a = x = 0
    mem = [0] * 16
    pc = 0
    back: dict[int, int] = {}
    while True:
        code, jt, jf, k = prog[pc]
        k &= M32
        pc += 1
        cls, size, mode = code & 7, code & 0x18, code & 0xE0
        if cls == 0 and mode == 0x20 and k >= AD_FROM:     # Linux ancillary field, whatever the size
            a = a ^ x if k - AD_FROM == 40 else aux[k - AD_FROM] & M32
        elif cls in (0, 1) and mode in (0x20, 0x40, 0xA0):   # packet loads
            n = {0x00: 4, 0x08: 2, 0x10: 1}[size]
            off = k + (x if mode == 0x40 else 0)
            if off + n > buflen:
                return 0
            v = int.from_bytes(pkt[off: off + n], "big")
            if mode == 0xA0:
                x = (v & 0xF) << 2
            else:
                a = v
        elif cls == 0:
            a = {0x00: k, 0x60: mem[k % 16], 0x80: wirelen}[mode] & M32
        elif cls == 1:
            x = {0x00: k, 0x60: mem[k % 16], 0x80: wirelen}[mode] & M32
        elif cls == 2:
            mem[k] = a
        elif cls == 3:
            mem[k] = x
        elif cls == 4:
            op = code & 0xF0
            v = x if code & 8 else k
            if op in (0x30, 0x90) and v == 0:
                return 0
            if op == 0x00:
                a = a + v
            elif op == 0x10:
                a = a - v
            elif op == 0x20:
                a = a * v
            elif op == 0x30:
                a = a // v
            elif op == 0x40:
                a = a | v
            elif op == 0x50:
                a = a & v
            elif op == 0x60:
                a = a << v if v < 32 else 0
            elif op == 0x70:
                a = a >> v if v < 32 else 0
            elif op == 0x80:
                a = -a
            elif op == 0x90:
                a = a % v
            elif op == 0xA0:
                a = a ^ v
            a &= M32
        elif cls == 5:
            op = code & 0xF0
            if op == 0x00:
                if k >= 1 << 31:
                    back[pc + k - (1 << 32)] = n = back.get(pc + k - (1 << 32), 0) + 1
                    if stats is not None:
                        stats["back"] = max(stats.get("back", 0), n)
                        state = (pc, a, x, tuple(mem))
                        if state in stats.setdefault("states", set()):
                            stats["cycle"] = True   # the same state again: it would loop for ever
                            return 0
                        stats["states"].add(state)
                    if bound is not None and n > bound:
                        return 0
                pc = (pc + k) & M32
                continue
            v = x if code & 8 else k
            cond = {0x10: a == v, 0x20: a > v, 0x30: a >= v, 0x40: bool(a & v)}[op]
            pc += jt if cond else jf
        elif cls == 6:
            return a if code & 0x18 == 0x10 else k
        else:
            if code & 0xF8 == 0x80:
                a = x
            else:
                x = a
