"""In-kernel predicates: --pid, --comm, --netns, --ifindex/--ifname, --mark and BTF field paths (--where)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from bpf.asm import (AND, BYTES_SIZE, DW, FP, JEQ, JGE, JGT, JLE, JLT, JNE, JSET, JSGE, JSGT, JSLE, JSLT, R0,
                     R1, R2, R3, R6, R8, R9, W, addi, alu64, arshi, call, ja, jmp, label, ld_imm64, ldx, lshi, mov,
                     movi, rshi, be)
from bpf.btf import Array, BTFError, Composite, Enum, Enum64, Int, Ptr, Type
from bpf.cdecl import c_decl
from bpf.uapi import Helper

from .drops import close_names, reason_value, short
from .points import Point
from .layout import STACK
from .errors import PredicateError

Predicate = Callable[["object"], list]   # Builder -> items; jumps to "out" to drop the packet



def _drop_unless_equal(reg: int, value: int) -> list:
    """Drop the packet unless reg == value (a 64-bit constant: no sign extension of large u32 values)."""
    return [ld_imm64(R1, value), jmp(JNE, reg, R1, "out", reg=True)]


def pid(value: int) -> Predicate:
    def emit(b) -> list:
        return [call(Helper.get_current_pid_tgid), rshi(R0, 32)] + _drop_unless_equal(R0, value)
    return emit


def _string_words(text: str, size: int, what: str) -> bytes:
    raw = text.encode()
    if len(raw) >= size:
        raise PredicateError(f"{what}: {text!r} is longer than {size - 1} bytes")
    return raw + b"\0" * (size - len(raw))


def _compare_bytes(base: int, off: int, want: bytes, label_no: str) -> list:
    """Jump to label_no unless the bytes at base+off equal `want` (compared in u64/u32/u16/u8 pieces)."""
    out: list = []
    i = 0
    while i < len(want):
        for n in (8, 4, 2, 1):
            if len(want) - i >= n:
                break
        val = int.from_bytes(want[i:i + n], "little")
        out.append(ldx(BYTES_SIZE[n], R0, base, off + i))
        if val >= 1 << 31:   # a jump's imm32 is sign-extended: 0x80000000 and up would never be equal
            out += [ld_imm64(R1, val), jmp(JNE, R0, R1, label_no, reg=True)]
        else:
            out.append(jmp(JNE, R0, val, label_no))
        i += n
    return out


def comm(name: str) -> Predicate:
    want = _string_words(name, 16, "--comm")

    def emit(b) -> list:
        return [mov(R1, FP), addi(R1, STACK.comm), movi(R2, 16), call(Helper.get_current_comm)] + \
            _compare_bytes(FP, STACK.comm, want[:len(name.encode()) + 1], "out")
    return emit


def mark(value: int) -> Predicate:
    def emit(b) -> list:
        b.read(W, R8, R6, b.f.mark)
        return _drop_unless_equal(R8, value)
    return emit


def _dev(b) -> None:
    b.read(DW, R9, R6, b.f.dev)
    b.emit(jmp(JEQ, R9, 0, "out"))


def ifindex(value: int) -> Predicate:
    def emit(b) -> list:
        _dev(b)
        b.read(W, R8, R9, b.f.ifindex)
        return _drop_unless_equal(R8, value)
    return emit


def ifname(name: str) -> Predicate:
    want = _string_words(name, 16, "--ifname")[:len(name.encode()) + 1]

    def emit(b) -> list:
        _dev(b)
        off = b.f.dev_name
        b.emit(mov(R1, FP), addi(R1, STACK.comm), movi(R2, 16), mov(R3, R9), addi(R3, off),
               call(Helper.probe_read_kernel), jmp(JNE, R0, 0, "out"))
        return _compare_bytes(FP, STACK.comm, want, "out")
    return emit


def netns(inum: int) -> Predicate:
    def emit(b) -> list:
        if b.f.net_inum is None:
            raise PredicateError("--netns: this kernel's struct net has no ns.inum")
        _dev(b)
        b.read(DW, R9, R9, b.f.dev_net)
        b.emit(jmp(JEQ, R9, 0, "out"))
        b.read(W, R8, R9, b.f.net_inum)
        return _drop_unless_equal(R8, inum)
    return emit


# ---- --where 'PATH OP VALUE' -------------------------------------------------------------------

_WHERE = re.compile(r"^\s*(?P<path>[A-Za-z_][\w]*(?:\s*(?:->|\.)\s*[A-Za-z_]\w*)*)\s*"
                    r"(?P<op>==|!=|<=|>=|<|>|&)\s*(?P<value>.+?)\s*$")
_OPS_UNSIGNED = {"==": JNE, "!=": JEQ, "<": JGE, "<=": JGT, ">": JLE, ">=": JLT}   # jump to drop when false
_OPS_SIGNED = {"==": JNE, "!=": JEQ, "<": JSGE, "<=": JSGT, ">": JSLE, ">=": JSLT}


@dataclass
class Step:
    deref: bool        # '->' (load the pointer, then go into what it points to) or '.' / the root
    name: str


def _parse_path(path: str) -> list[Step]:
    tokens = re.findall(r"->|\.|[A-Za-z_]\w*", path)
    steps = [Step(False, tokens[0])]
    for sep, name in zip(tokens[1::2], tokens[2::2]):
        steps.append(Step(sep == "->", name))
    return steps


def where(point: Point, text: str) -> Predicate:
    """Compile `PATH OP VALUE` over the point's arguments (by name; `skb` always) and, for fexit, `return`."""
    m = _WHERE.match(text)
    if not m:
        raise PredicateError(f"--where {text!r}: expected PATH OP VALUE, e.g. 'skb->len > 1000' "
                             f"(operators: == != < <= > >= &)")
    path, op, value_text = m.group("path"), m.group("op"), m.group("value")
    steps = _parse_path(path)
    arg_index, t = _root(point, path, steps[0].name)
    chain, off, bits_at, t = _walk(path, steps, t)
    leaf = t.strip()
    field = Field(point, path, arg_index, chain, off, bits_at, len(steps) == 1)
    if isinstance(leaf, Array):
        return _string_predicate(field, op, value_text, leaf)
    return _number_predicate(field, op, value_text, leaf, big_endian=_is_big_endian(t))


def _root(point: Point, path: str, root: str) -> tuple[int, Type]:
    """The context argument a path starts from: (its index, its type); `return` at fexit is past the arguments."""
    names = [p.name for p in point.params]
    if root == "return":
        if point.kind != "fexit":
            raise PredicateError(f"--where {path}: 'return' exists only at fexit points")
        if point.ret is None or point.ret.strip().kind == "void":
            raise PredicateError(f"--where {path}: {point.name} returns nothing")
        arg_index, t = len(point.params), point.ret
    elif root in names:
        arg_index = names.index(root)
        t = point.params[arg_index].type
    elif root == "skb":
        arg_index, t = point.skb_index, point.params[point.skb_index].type
    else:
        raise PredicateError(f"--where {path}: no argument {root!r} at {point.spec} "
                             f"(arguments: {', '.join(n for n in names if n) or 'none'})")
    if point.kind == "kprobe" and arg_index >= 6:
        raise PredicateError(f"--where {path}: argument {arg_index + 1} is past the registers")
    return arg_index, t


def _walk(path: str, steps: list[Step], t: Type) -> tuple[list[int], int, tuple[int, int] | None, Type]:
    """Walk the path through BTF: the offsets of the pointers loaded on the way, then the leaf's offset (and its
    bits) in the last object, and the leaf's type."""
    chain: list[int] = []
    off = 0
    bits_at: tuple[int, int] | None = None
    walked = steps[0].name
    in_object = False     # at the root, R9 holds the argument's value itself
    for st_ in steps[1:]:
        t = t.strip()
        if st_.deref:
            if not isinstance(t, Ptr):
                raise PredicateError(f"--where {path}: {walked} is not a pointer ({c_decl(t)})")
            if in_object:
                chain.append(off)
            t, off, in_object = t.target.strip(), 0, True
        elif not in_object or isinstance(t, Ptr):
            raise PredicateError(f"--where {path}: {walked} is a pointer: use -> before {st_.name}")
        mem, bits = _member(path, t, st_.name, walked)
        bits_at = (off * 8 + bits, mem.bitfield_size) if mem.bitfield_size else None
        off += bits // 8
        t = mem.type
        walked += ("->" if st_.deref else ".") + st_.name
    return chain, off, bits_at, t


def _member(path: str, t: Type, name: str, walked: str):
    if not isinstance(t, Composite):
        raise PredicateError(f"--where {path}: {walked} is not a struct or union ({c_decl(t)})")
    try:
        return t.member(name)
    except BTFError:
        raise PredicateError(f"--where {path}: {c_decl(t)} has no member {name!r}") from None


@dataclass
class Field:
    point: Point
    path: str
    arg_index: int
    chain: list[int]              # offsets of the pointers loaded on the way
    off: int                      # the leaf's byte offset in the last object
    bits: tuple[int, int] | None  # (bit offset, width) of a bitfield leaf
    is_arg: bool                  # the path is the argument itself

    def base(self, b) -> None:
        """R9 = the object the leaf lies in (or, for a bare argument, its value)."""
        ctx_off = b.f.arg_regs[self.arg_index] if self.point.kind == "kprobe" else 8 * self.arg_index
        b.emit(ldx(DW, R9, FP, STACK.ctx), ldx(DW, R9, R9, ctx_off))
        if self.is_arg:
            return
        for off in self.chain:
            b.emit(jmp(JEQ, R9, 0, "out"))
            b.read(DW, R9, R9, off)
        b.emit(jmp(JEQ, R9, 0, "out"))


def _string_predicate(f: Field, op: str, text: str, leaf: Array) -> Predicate:
    elem = leaf.elem.strip()
    if not (isinstance(elem, Int) and elem.size == 1):
        raise PredicateError(f"--where {f.path}: arrays other than char[] cannot be compared")
    if op not in ("==", "!="):
        raise PredicateError(f"--where {f.path}: strings compare with == or != only")
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    want = _string_words(text, leaf.nelems, f"--where {f.path}")[:len(text.encode()) + 1]

    def emit(b) -> list:
        f.base(b)
        b.emit(mov(R1, FP), addi(R1, STACK.comm), movi(R2, len(want)), mov(R3, R9), addi(R3, f.off),
               call(Helper.probe_read_kernel), jmp(JNE, R0, 0, "out"))
        if op == "==":
            return _compare_bytes(FP, STACK.comm, want, "out")
        keep = b.fresh("where_ne")
        return _compare_bytes(FP, STACK.comm, want, keep) + [ja("out"), label(keep)]
    return emit


def _is_big_endian(t: Type) -> bool:
    """Declared as __be16/__be32/__be64 (through typedefs and qualifiers): compared in host order."""
    while t is not None and t.kind in ("typedef", "const", "volatile", "restrict", "type_tag"):
        if t.kind == "typedef" and t.name in ("__be16", "__be32", "__be64"):
            return True
        t = t.target
    return False


def _number_predicate(f: Field, op: str, text: str, leaf: Type, big_endian: bool = False) -> Predicate:
    if isinstance(leaf, Ptr):
        size, signed = 8, False
    elif isinstance(leaf, (Int, Enum, Enum64)):
        size, signed = leaf.size, bool(getattr(leaf, "signed", False))
    else:
        raise PredicateError(f"--where {f.path}: cannot compare a {c_decl(leaf)}")
    if size not in BYTES_SIZE:
        raise PredicateError(f"--where {f.path}: a {size}-byte field cannot be compared")
    value = _value(f.path, text, leaf)

    def emit(b) -> list:
        f.base(b)
        items: list = []
        if f.is_arg:
            b.emit(mov(R8, R9))
            if size < 8:
                items.append(lshi(R8, 64 - 8 * size))
                items.append(arshi(R8, 64 - 8 * size) if signed else rshi(R8, 64 - 8 * size))
        elif f.bits is not None:
            bit_off, nbits = f.bits
            b.read(DW, R8, R9, bit_off // 8)
            items += [rshi(R8, bit_off % 8)]
            if nbits < 64:
                items += [ld_imm64(R1, (1 << nbits) - 1), alu64(AND, R8, R1, reg=True)]
        else:
            b.read(BYTES_SIZE[size], R8, R9, f.off)
            if signed and size < 8:
                items += [lshi(R8, 64 - 8 * size), arshi(R8, 64 - 8 * size)]
        if big_endian and size > 1 and f.bits is None:
            items.append(be(R8, 8 * size))   # network order in memory: compare as the number users write
        if op == "&":
            keep = b.fresh("where_set")
            return items + [ld_imm64(R1, value), jmp(JSET, R8, R1, keep, reg=True), ja("out"), label(keep)]
        ops = _OPS_SIGNED if signed else _OPS_UNSIGNED
        return items + [ld_imm64(R1, value), jmp(ops[op], R8, R1, "out", reg=True)]
    return emit


def _value(path: str, text: str, leaf: Type) -> int:
    if isinstance(leaf, (Enum, Enum64)):
        v = reason_value(leaf, text)   # a name, whole or without the enum's prefix (NO_SOCKET)
        if v is not None:
            return v & 0xFFFFFFFFFFFFFFFF
    try:
        v = int(text, 0)
    except ValueError:
        hint = ""
        if isinstance(leaf, (Enum, Enum64)):
            close = close_names(leaf, text)
            hint = (f"; did you mean {' or '.join(close)}?" if close else
                    f" (its names: {', '.join(short(k) for k in list(leaf.values)[:6])}, ...)")
            raise PredicateError(f"--where {path}: no {c_decl(leaf)} value called {text!r}{hint}") from None
        raise PredicateError(f"--where {path}: {text!r} is not a number{hint}") from None
    return v & 0xFFFFFFFFFFFFFFFF
