"""In-kernel predicates: --pid, --comm, --netns, --ifindex/--ifname, --mark, --queue and BTF field paths (--where)."""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

from bpf.asm import (AND, BYTES_SIZE, DW, FP, JEQ, JGE, JGT, JLE, JLT, JNE, JSET, JSGE, JSGT, JSLE, JSLT, R0,
                     R1, R2, R3, R6, R8, R9, W, addi, alu64, arshi, call, ja, jmp, label, ld_imm64, ldx, lshi, mov,
                     movi, rshi, be, H)
from bpf.btf import Array, Enum, Enum64, Int, Ptr, Type
from bpf.cdecl import c_decl
from bpf.uapi import Helper

from fcap.kernel.drops import close_names, reason_value, short
from fcap.points.spec import Point
from fcap.kernel.parts import SELECT, Part
from fcap.kernel.layout import STACK
from fcap.errors import PathError, PredicateError
from fcap.points.members import parse_path, root, walk

Predicate = Callable[["object"], list]   # Builder -> items; jumps to "out" to drop the packet


def emit_all(b) -> None:
    """The program's predicates, in their order (cheap first): each jumps to "out" to turn the packet away."""
    for pred in b.options.predicates:
        b.emit(pred(b))


PREDICATES = Part("predicates", on=lambda point, options, maps: bool(options.predicates),
                     stages={SELECT: emit_all}, turns_away=True)


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
        b.skb_mark(R8)
        return _drop_unless_equal(R8, value)
    return emit


def _dev(b) -> None:
    b.device(R9)
    b.emit(jmp(JEQ, R9, 0, "out"))


def ifindex(value: int) -> Predicate:
    def emit(b) -> list:
        _dev(b)
        b.read(W, R8, R9, b.offsets.ifindex)
        return _drop_unless_equal(R8, value)
    return emit


def ifname(name: str) -> Predicate:
    want = _string_words(name, 16, "--ifname")[:len(name.encode()) + 1]

    def emit(b) -> list:
        _dev(b)
        off = b.offsets.dev_name
        b.emit(mov(R1, FP), addi(R1, STACK.comm), movi(R2, 16), mov(R3, R9), addi(R3, off),
               call(Helper.probe_read_kernel), jmp(JNE, R0, 0, "out"))
        return _compare_bytes(FP, STACK.comm, want, "out")
    return emit


def netns(inum: int) -> Predicate:
    def emit(b) -> list:
        if b.offsets.net_inum is None:
            raise PredicateError("--netns: this kernel's struct net has no ns.inum")
        _dev(b)
        b.read(DW, R9, R9, b.offsets.dev_net)
        b.emit(jmp(JEQ, R9, 0, "out"))
        b.read(W, R8, R9, b.offsets.net_inum)
        return _drop_unless_equal(R8, inum)
    return emit


def queue(value: int) -> Predicate:
    """The device queue epb_queue records (fcap.kernel.epbopts): skb->queue_mapping at a transmit point, less one at
    a receive point (a driver records queue + 1; 0: none recorded, turned away)."""
    def emit(b) -> list:
        from fcap.kernel.epbopts import queue_source
        source = queue_source(b.point)
        if source is None:
            raise PredicateError(f"--queue: {b.point.spec} has no device queue (device-layer points have one: "
                                 "tp_btf/net_dev_start_xmit, tp_btf/netif_receive_skb, ...)")
        b.read(H, R8, R6, b.offsets.queue_mapping)
        return _drop_unless_equal(R8, value + (source == "rx"))
    return emit


def not_device(ifindex_value: int, inum: int) -> Callable[[Point], Predicate]:
    """A factory that turns away the packets of one device of one network namespace (--mirror's own: nothing
    loops) and keeps every other packet, those with no device too."""
    def emit(b) -> list:
        keep = b.fresh("other_dev")
        b.device(R9)
        b.emit(jmp(JEQ, R9, 0, keep))
        b.read(W, R8, R9, b.offsets.ifindex)
        b.emit(jmp(JNE, R8, ifindex_value, keep))
        if b.offsets.net_inum is not None:
            b.read(DW, R9, R9, b.offsets.dev_net)
            b.emit(jmp(JEQ, R9, 0, keep))
            b.read(W, R8, R9, b.offsets.net_inum)
            b.emit(ld_imm64(R1, inum), jmp(JNE, R8, R1, keep, reg=True))
        return [ja("out"), label(keep)]
    return _constant(emit)


def direction(want: str) -> Callable[[Point], Predicate]:
    """-Q in|out as a factory of per-point predicates. A packet goes out at a transmit point (whatever its
    pkt_type: one the host sends is PACKET_HOST there); elsewhere it goes out when its pkt_type is
    PACKET_OUTGOING (as AF_PACKET marks what it sees sent), else in: what the LINUX_SLL2 header says. At an XDP
    program (no skb: its context is an xdp_buff) every packet comes in."""
    from fcap.files.linktypes import PACKET_HOST, PACKET_OUTGOING

    def make(point: Point) -> Predicate:
        def emit(b) -> list:
            if point.direction == "out":
                b.emit(movi(R8, PACKET_OUTGOING))   # (the verifier then knows which way the test goes)
            elif not point.kind.on_skb:
                b.emit(movi(R8, PACKET_HOST))
            else:
                b.read(BYTES_SIZE[1], R8, R6, b.offsets.pkt_type_byte)
                if b.offsets.pkt_type_shift:
                    b.emit(rshi(R8, b.offsets.pkt_type_shift))
                b.emit(alu64(AND, R8, b.offsets.pkt_type_mask))
            return [jmp(JNE if want == "out" else JEQ, R8, PACKET_OUTGOING, "out")]
        return emit
    make.by_direction = True   # (a program shared by points: one per direction, fcap.live.multi)
    return make


DIRECTIONS = ("in", "out", "inout")   # -Q's values
_BY_DIRECTION = direction   # (factories' keyword has its name)


def factories(where=(), direction: str | None = None, cgroup: str | None = None, container: str | None = None,
              **tests) -> list:
    """The factories (point -> predicate) of a capture's predicates, cheap first: the one way the command line's
    flags and the API's keywords become them. `tests`: pid, comm, mark, ifindex, ifname, netns (None: untested).
    PredicateError (one line) for a value no program can test."""
    from fcap.features.selectors import SELECTORS
    out = []
    for s in SELECTORS:
        value = tests.pop(s.name, None)
        if value is None:
            continue
        if not isinstance(value, s.kind) or isinstance(value, bool) or (s.least is not None and value < s.least):
            want = "a name" if s.kind is str else f"a number, {s.least} or more"
            raise PredicateError(f"{s.name}: {want}, not {value!r}")
        factory = _constant(globals()[s.name](value))   # (a selector's test: the function of its name above)
        factory.reads_args = s.per_point
        out.append(factory)
    if tests:
        raise TypeError(f"factories(): unknown keywords {sorted(tests)}")
    if cgroup is not None or container is not None:
        from fcap.kernel import context
        out += context.target_predicates(cgroup, container)
    out += [where_factory(text) for text in where]
    if direction is not None:
        if not isinstance(direction, str) or direction.lower() not in DIRECTIONS:
            raise PredicateError(f"unknown capture direction `{direction}'")
        if direction.lower() != "inout":
            out.insert(0, _BY_DIRECTION(direction.lower()))
    return out


def _constant(pred: Predicate) -> Callable[[Point], Predicate]:
    def make(point: Point) -> Predicate:
        return pred
    return make


# ---- --where 'PATH OP VALUE' -------------------------------------------------------------------

_WHERE = re.compile(r"^\s*(?P<path>[A-Za-z_][\w]*(?:\s*(?:->|\.)\s*[A-Za-z_]\w*)*)\s*"
                    r"(?P<op>==|!=|<=|>=|<|>|&)\s*(?P<value>.+?)\s*$")
_OPS_UNSIGNED = {"==": JNE, "!=": JEQ, "<": JGE, "<=": JGT, ">": JLE, ">=": JLT}   # jump to drop when false
_OPS_SIGNED = {"==": JNE, "!=": JEQ, "<": JSGE, "<=": JSGT, ">": JSLE, ">=": JSLT}


def where_factory(text: str) -> Callable[[Point], Predicate]:
    """--where TEXT as a factory of per-point predicates; it reads the point's own arguments (reads_args: a program
    shared by many functions cannot run it). `cgroup == PATH` and `container == NAME` test the packet's context, as
    --cgroup and --container do (fcap.kernel.context)."""
    from fcap.kernel import context
    term = context.where_term(text)
    if term is not None:
        return context.target_predicates(**{term[0]: term[1]})[0]

    def make(point: Point) -> Predicate:
        return where(point, text)
    make.reads_args = True
    return make


def where(point: Point, text: str) -> Predicate:
    """Compile `PATH OP VALUE` over the point's arguments (by name; `skb` always) and, for fexit, `return`."""
    m = _WHERE.match(text)
    if not m:
        raise PredicateError(f"--where {text!r}: expected PATH OP VALUE, e.g. 'skb->len > 1000' "
                             f"(operators: == != < <= > >= &)")
    path, op, value_text = m.group("path"), m.group("op"), m.group("value")
    try:
        steps = parse_path(path)
        arg_index, t = root(point, path, steps[0].name, "--where")
        chain, off, bits_at, t = walk(path, steps, t, "--where")
    except PathError as e:
        raise PredicateError(str(e)) from None
    leaf = t.strip()
    field = Field(point, path, arg_index, chain, off, bits_at, len(steps) == 1)
    if isinstance(leaf, Array):
        return _string_predicate(field, op, value_text, leaf)
    return _number_predicate(field, op, value_text, leaf, big_endian=_is_big_endian(t))


class Field(NamedTuple):
    point: Point
    path: str
    arg_index: int
    chain: list[int]              # offsets of the pointers loaded on the way
    off: int                      # the leaf's byte offset in the last object
    bits: tuple[int, int] | None  # (bit offset, width) of a bitfield leaf
    is_arg: bool                  # the path is the argument itself

    def base(self, b) -> None:
        """R9 = the object the leaf lies in (or, for a bare argument, its value)."""
        ctx_off = self.point.kind.arg_offset(self.arg_index)
        b.emit(ldx(DW, R9, FP, STACK.ctx), ldx(DW, R9, R9, ctx_off))
        if self.is_arg:
            return
        for off in self.chain:
            b.emit(jmp(JEQ, R9, 0, "out"))
            b.read(DW, R9, R9, off)
        b.emit(jmp(JEQ, R9, 0, "out"))

    def leaf_base(self, b) -> int:
        """The register the leaf is read from: R6 where it is a member of the point's skb and the program reads
        those from its copy (fcap.kernel.snapshot), else R9 (base())."""
        in_skb = not self.chain and self.arg_index == self.point.skb_index
        return R6 if in_skb and b.snap is not None else R9


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
            b.read(DW, R8, f.leaf_base(b), bit_off // 8)
            items += [rshi(R8, bit_off % 8)]
            if nbits < 64:
                items += [ld_imm64(R1, (1 << nbits) - 1), alu64(AND, R8, R1, reg=True)]
        else:
            b.read(BYTES_SIZE[size], R8, f.leaf_base(b), f.off)
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
