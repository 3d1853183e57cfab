"""eBPF instructions: builders, labels resolved in one pass, encoding, and a disassembler."""

from __future__ import annotations

import struct
from typing import Iterable, NamedTuple, Union

from .errors import AsmError
from .uapi import PSEUDO_CALL, PSEUDO_KFUNC_CALL, PSEUDO_MAP_FD, PSEUDO_MAP_VALUE, Helper

# instruction classes
LD, LDX, ST, STX, ALU, JMP, JMP32, ALU64 = range(8)
# sizes
W, H, B, DW = 0x00, 0x08, 0x10, 0x18
SIZE_BYTES = {W: 4, H: 2, B: 1, DW: 8}                    # size code -> bytes
BYTES_SIZE = {n: size for size, n in SIZE_BYTES.items()}   # bytes -> size code
# modes
IMM, ABS, IND, MEM, MEMSX, ATOMIC = 0x00, 0x20, 0x40, 0x60, 0x80, 0xC0
# source
K, X = 0x00, 0x08
# alu ops
ADD, SUB, MUL, DIV, OR, AND, LSH, RSH, NEG, MOD, XOR, MOV, ARSH, END = (
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0)
TO_LE, TO_BE = 0x00, 0x08
# jump ops
JA, JEQ, JGT, JGE, JSET, JNE, JSGT, JSGE, CALL, EXIT, JLT, JLE, JSLT, JSLE = (
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0)

R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)
FP = R10

_INSN = struct.Struct("<BBhi")
Target = Union[str, int]  # a label name, or a relative offset


class Insn(NamedTuple):
    """One instruction (ld_imm64 counts as one Insn and encodes to two slots)."""

    op: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0
    target: str | None = None   # label a jump goes to, resolved by assemble()
    imm64: int | None = None    # the 64-bit constant of ld_imm64

    @property
    def slots(self) -> int:
        return 2 if self.imm64 is not None else 1

    def encode(self) -> bytes:
        regs = (self.src << 4) | self.dst
        if self.imm64 is not None:
            lo, hi = self.imm64 & 0xFFFFFFFF, (self.imm64 >> 32) & 0xFFFFFFFF
            return _INSN.pack(self.op, regs, 0, _s32(lo)) + _INSN.pack(0, 0, 0, _s32(hi))
        return _INSN.pack(self.op, regs, self.off, _s32(self.imm))


class Label(NamedTuple):
    name: str


class Holds(NamedTuple):
    """An annotation, no instruction: from here, register `reg` holds a pointer of `kind` (a lower-case
    bpf.ptrkinds.Kind name, e.g. "mem_untrusted") on this path. Occupies no slot."""

    reg: int
    kind: str


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


# ---- builders ---------------------------------------------------------------------------------

def _alu(cls: int, op: int, dst: int, src: int | None, imm: int) -> Insn:
    if src is None:
        return Insn(cls | op | K, dst, 0, 0, imm)
    return Insn(cls | op | X, dst, src)


def alu64(op: int, dst: int, val: int, *, reg: bool = False) -> Insn:
    """dst op= val (64-bit); val is a register when reg=True, else an immediate."""
    return _alu(ALU64, op, dst, val if reg else None, 0 if reg else val)


def alu32(op: int, dst: int, val: int, *, reg: bool = False) -> Insn:
    return _alu(ALU, op, dst, val if reg else None, 0 if reg else val)


def mov(dst: int, src: int) -> Insn:
    """dst = src (registers, 64-bit)."""
    return Insn(ALU64 | MOV | X, dst, src)


def movi(dst: int, imm: int) -> Insn:
    """dst = imm (sign-extended 32-bit immediate)."""
    return Insn(ALU64 | MOV | K, dst, 0, 0, imm)


def mov32(dst: int, src: int) -> Insn:
    return Insn(ALU | MOV | X, dst, src)


def addi(dst: int, imm: int) -> Insn:
    return Insn(ALU64 | ADD | K, dst, 0, 0, imm)


def add(dst: int, src: int) -> Insn:
    return Insn(ALU64 | ADD | X, dst, src)


def andi(dst: int, imm: int) -> Insn:
    return Insn(ALU64 | AND | K, dst, 0, 0, imm)


def lshi(dst: int, imm: int) -> Insn:
    return Insn(ALU64 | LSH | K, dst, 0, 0, imm)


def rshi(dst: int, imm: int) -> Insn:
    return Insn(ALU64 | RSH | K, dst, 0, 0, imm)


def arsh(dst: int, src: int) -> Insn:
    """dst s>>= src (64-bit, sign-extending)."""
    return Insn(ALU64 | ARSH | X, dst, src)


def arshi(dst: int, imm: int) -> Insn:
    """dst s>>= imm (64-bit, sign-extending)."""
    return Insn(ALU64 | ARSH | K, dst, 0, 0, imm)


def be(dst: int, bits: int) -> Insn:
    """Convert dst between host (little-endian) and big-endian order, zero-extending (bits 16/32/64)."""
    return Insn(ALU | END | TO_BE, dst, 0, 0, bits)


def ldx(size: int, dst: int, src: int, off: int) -> Insn:
    """dst = *(size *)(src + off)"""
    return Insn(LDX | MEM | size, dst, src, off)


def stx(size: int, dst: int, off: int, src: int) -> Insn:
    """*(size *)(dst + off) = src"""
    return Insn(STX | MEM | size, dst, src, off)


def st(size: int, dst: int, off: int, imm: int) -> Insn:
    """*(size *)(dst + off) = imm"""
    return Insn(ST | MEM | size, dst, 0, off, imm)


FETCH = 0x01


def fetch_add(size: int, dst: int, off: int, src: int) -> Insn:
    """src = atomic_fetch_add((size *)(dst + off), src): fully ordered (a release of the stores before it)."""
    return Insn(STX | ATOMIC | size, dst, src, off, ADD | FETCH)


def atomic_add(size: int, dst: int, off: int, src: int) -> Insn:
    """*(size *)(dst + off) += src, atomically, nothing fetched (the old XADD: every kernel with eBPF)."""
    return Insn(STX | ATOMIC | size, dst, src, off, ADD)


STORE_REL = 0x110   # BPF_STORE_REL (Linux 6.15+)


def store_release(size: int, dst: int, off: int, src: int) -> Insn:
    """*(size *)(dst + off) = src, ordered after every load and store before it (a release); no lock: on x86 the JIT
    makes it a plain store (its stores are in order anyway), elsewhere the architecture's store-release."""
    return Insn(STX | ATOMIC | size, dst, src, off, STORE_REL)


def ld_imm64(dst: int, value: int) -> Insn:
    return Insn(LD | DW | IMM, dst, 0, 0, 0, imm64=value & 0xFFFFFFFFFFFFFFFF)


def ld_map_fd(dst: int, fd: int) -> Insn:
    """dst = the map whose fd is `fd` (the kernel swaps in its address)."""
    return Insn(LD | DW | IMM, dst, PSEUDO_MAP_FD, 0, 0, imm64=fd)


def ld_map_value(dst: int, fd: int, offset: int = 0) -> Insn:
    """dst = &map_value[offset] of an array map's element 0."""
    return Insn(LD | DW | IMM, dst, PSEUDO_MAP_VALUE, 0, 0, imm64=(offset << 32) | fd)


def _jump(cls: int, op: int, dst: int, val: int, target: Target, reg: bool) -> Insn:
    lbl = target if isinstance(target, str) else None
    off = 0 if lbl is not None else int(target)
    if reg:
        return Insn(cls | op | X, dst, val, off, 0, target=lbl)
    return Insn(cls | op | K, dst, 0, off, val, target=lbl)


def jmp(op: int, dst: int, val: int, target: Target, *, reg: bool = False) -> Insn:
    """if dst op val goto target (64-bit compare)."""
    return _jump(JMP, op, dst, val, target, reg)


def jmp32(op: int, dst: int, val: int, target: Target, *, reg: bool = False) -> Insn:
    return _jump(JMP32, op, dst, val, target, reg)


def ja(target: Target) -> Insn:
    return _jump(JMP, JA, 0, 0, target, False)


def call(helper: int) -> Insn:
    return Insn(JMP | CALL, 0, 0, 0, int(helper))


def kfunc_call(btf_id: int) -> Insn:
    """Call the kernel function (kfunc) whose vmlinux BTF id is `btf_id`."""
    return Insn(JMP | CALL, 0, PSEUDO_KFUNC_CALL, 0, btf_id)


def exit_() -> Insn:
    return Insn(JMP | EXIT)


def label(name: str) -> Label:
    return Label(name)


def holds(reg: int, kind: str) -> Holds:
    """From here, `reg` holds a pointer of `kind` (what bpf.ptrkinds cannot tell from the instructions alone,
    e.g. "mem_untrusted" for skb->head read from a BTF-typed skb)."""
    return Holds(reg, kind)


# ---- assembly ---------------------------------------------------------------------------------

Item = Union[Insn, Label, Holds]


def resolve(items: Iterable[Item]) -> list[Insn]:
    """Resolve label targets into relative offsets (in slots); drop labels and annotations (Holds)."""
    items = list(items)
    where: dict[str, int] = {}
    pos = 0
    for it in items:
        if isinstance(it, Label):
            if it.name in where:
                raise AsmError(f"duplicate label {it.name!r}")
            where[it.name] = pos
        elif not isinstance(it, Holds):
            pos += it.slots
    out: list[Insn] = []
    pos = 0
    for it in items:
        if isinstance(it, (Label, Holds)):
            continue
        pos += it.slots
        if it.target is not None:
            if it.target not in where:
                raise AsmError(f"jump to unknown label {it.target!r}")
            off = where[it.target] - pos
            if not -0x8000 <= off <= 0x7FFF:
                raise AsmError(f"jump to {it.target!r} out of range ({off})")
            it = it._replace(off=off, target=None)
        out.append(it)
    return out


def assemble(items: Iterable[Item]) -> bytes:
    """Items (instructions and labels) → the bytes the kernel loads."""
    return b"".join(i.encode() for i in resolve(items))


def decode(code: bytes) -> list[Insn]:
    """Bytes → instructions (ld_imm64 merged into one Insn)."""
    if len(code) % 8:
        raise AsmError(f"program length {len(code)} is not a multiple of 8")
    out: list[Insn] = []
    i = 0
    while i < len(code):
        op, regs, off, imm = _INSN.unpack_from(code, i)
        i += 8
        if op == LD | DW | IMM:
            if i >= len(code):
                raise AsmError("ld_imm64 without its second half")
            hi = _INSN.unpack_from(code, i)[3]
            i += 8
            out.append(Insn(op, regs & 0xF, regs >> 4, off, 0, imm64=(imm & 0xFFFFFFFF) | ((hi & 0xFFFFFFFF) << 32)))
        else:
            out.append(Insn(op, regs & 0xF, regs >> 4, off, imm))
    return out


# ---- disassembly (bpftool-like syntax) ---------------------------------------------------------

_ALU_SYM = {ADD: "+=", SUB: "-=", MUL: "*=", DIV: "/=", OR: "|=", AND: "&=", LSH: "<<=", RSH: ">>=",
            MOD: "%=", XOR: "^=", MOV: "=", ARSH: "s>>="}
_JMP_SYM = {JEQ: "==", JGT: ">", JGE: ">=", JSET: "&", JNE: "!=", JSGT: "s>", JSGE: "s>=", JLT: "<",
            JLE: "<=", JSLT: "s<", JSLE: "s<="}
_SZ = {size: f"u{8 * n}" for size, n in SIZE_BYTES.items()}
_CALLEE = {PSEUDO_CALL: "pc{:+d}", PSEUDO_KFUNC_CALL: "kfunc#{}"}  # by src_reg; 0: a helper


def _helper_name(imm: int) -> str:
    try:
        return f"bpf_{Helper(imm).name}#{imm}"
    except ValueError:
        return f"helper#{imm}"


def _fmt_alu(ins: Insn) -> str:
    op, r = ins.op & 0xF0, "w" if ins.op & 7 == ALU else "r"
    d = f"{r}{ins.dst}"
    if op == END:
        return f"r{ins.dst} = {'be' if ins.op & X else 'le'}{ins.imm} r{ins.dst}"
    if op == NEG:
        return f"{d} = -{d}"
    rhs = f"{r}{ins.src}" if ins.op & X else (hex(ins.imm) if ins.imm >= 0 else str(ins.imm))
    return f"{d} {_ALU_SYM.get(op, '?=')} {rhs}"


def _fmt_jmp(ins: Insn) -> str:
    op, r = ins.op & 0xF0, "w" if ins.op & 7 == JMP32 else "r"
    if op == CALL:
        callee = _helper_name(ins.imm) if ins.src == 0 else _CALLEE.get(ins.src, _CALLEE[PSEUDO_CALL]).format(ins.imm)
        return f"call {callee}"
    if op == EXIT:
        return "exit"
    tgt = ins.target or f"{ins.off:+d}"
    if op == JA:
        return f"goto {tgt}"
    rhs = f"{r}{ins.src}" if ins.op & X else hex(ins.imm & 0xFFFFFFFF)
    return f"if {r}{ins.dst} {_JMP_SYM.get(op, '?')} {rhs} goto {tgt}"


def _fmt_ld(ins: Insn) -> str:
    d, mode = f"r{ins.dst}", ins.op & 0xE0
    if ins.imm64 is not None:
        if ins.src == PSEUDO_MAP_FD:
            return f"{d} = map[fd:{ins.imm64}]"
        if ins.src == PSEUDO_MAP_VALUE:
            return f"{d} = map[fd:{ins.imm64 & 0xFFFFFFFF}][0]+{ins.imm64 >> 32}"
        return f"{d} = {hex(ins.imm64)} ll"
    if mode in (ABS, IND):
        where = f"{ins.imm}" if mode == ABS else f"r{ins.src} + {ins.imm}"
        return f"r0 = ntoh(*({_SZ[ins.op & 0x18]} *)skb[{where}])"
    return f"unknown op {ins.op:#04x}"


def _fmt_ldx(ins: Insn) -> str:
    return f"r{ins.dst} = *({_SZ[ins.op & 0x18]} *)(r{ins.src} {ins.off:+d})"


def _fmt_st(ins: Insn) -> str:
    return f"*({_SZ[ins.op & 0x18]} *)(r{ins.dst} {ins.off:+d}) = {hex(ins.imm)}"


def _fmt_stx(ins: Insn) -> str:
    mem, s = f"({_SZ[ins.op & 0x18]} *)(r{ins.dst} {ins.off:+d})", f"r{ins.src}"
    if ins.op & 0xE0 != ATOMIC:
        return f"*{mem} = {s}"
    if ins.imm == ADD | FETCH:
        return f"{s} = atomic_fetch_add({mem}, {s})"
    if ins.imm == STORE_REL:
        return f"store_release({mem}, {s})"
    return f"lock *{mem} += {s}"


_FORMAT = {ALU: _fmt_alu, ALU64: _fmt_alu, JMP: _fmt_jmp, JMP32: _fmt_jmp, LD: _fmt_ld, LDX: _fmt_ldx, ST: _fmt_st,
           STX: _fmt_stx}


def format_insn(ins: Insn) -> str:
    """One instruction in bpftool's syntax."""
    return _FORMAT[ins.op & 7](ins)


def disassemble(items: Iterable[Item] | bytes) -> str:
    """A listing: one numbered instruction per line (slot numbers), labels on lines of their own, what a Holds
    says as a comment line (`; r3: mem_untrusted`)."""
    if isinstance(items, (bytes, bytearray, memoryview)):
        items = decode(bytes(items))
    lines: list[str] = []
    pos = 0
    for it in items:
        if isinstance(it, Label):
            lines.append(f"{it.name}:")
            continue
        if isinstance(it, Holds):
            lines.append(f"       ; r{it.reg}: {it.kind}")
            continue
        lines.append(f"{pos:5d}: {format_insn(it)}")
        pos += it.slots
    return "\n".join(lines)
