"""Typed data from BTF: bytes shown as a BTF type, in the look of libbpf's btf_dump__dump_type_data (nested
structs and unions, arrays, bitfields, enums by name, pointers as addresses, char arrays as strings, zero members
left out unless asked; __be16/32/64 in host order), multi-line or compact; also decoded to Python values."""

from __future__ import annotations

import math
import struct
import weakref

from .btf_types import Array, Composite, Enum, Float, Int, Ptr, Type
from .cdecl import c_decl
from .errors import BTFError

MAX_DEPTH = 32           # nested structs/arrays deeper than this are shown as "..."
_PRINTABLE = frozenset(range(0x20, 0x7F))
_CHAR_NAMES = frozenset(("char", "signed char"))
_BIG_ENDIAN = frozenset(("__be16", "__be32", "__be64"))


class Node:
    """One value of a decoded type: a scalar (`value`, shown as `text`) or a struct/union/array (`children`).
    `zero`: every byte of it is zero; `missing`: the data ended before it."""

    __slots__ = ("children", "ctype", "elem", "items", "kind", "missing", "name", "text", "used", "value", "zero")

    def __init__(self, name: str, ctype: str, kind: str):
        self.name, self.ctype, self.kind = name, ctype, kind
        self.children: list[Node] | None = None
        self.items: list[str] | None = None     # an array of numbers: its elements' texts (values in `value`)
        self.elem = None
        self.used = 0                           # ... and how many lead up to the last non-zero one
        self.text = ""
        self.value: object = None
        self.zero = False
        self.missing = False

    def __repr__(self) -> str:
        return f"<Node {self.name or '(anon)'} ({self.ctype}) {self.text or len(self.children or ())}>"

    def python(self):
        """The value as Python data: dicts for structs/unions (anonymous members merged in), lists for arrays,
        str for enums with a name and for char strings, int for numbers and pointers, None where data ended."""
        if self.missing:
            return None
        if self.children is None:
            return self.value
        if self.kind == "array":
            return [c.python() for c in self.children]
        out: dict = {}
        for c in self.children:
            if c.name:
                out[c.name] = c.python()
            elif c.children is not None and c.kind != "array":
                out.update(c.python())
        return out

    def __getitem__(self, key):
        """A member by name (through anonymous members) or an array element by index."""
        if self.items is not None and isinstance(key, int):
            e = Node("", self.elem.ctype, self.elem.kind)
            e.value, e.text = self.value[key], self.items[key]
            e.zero = not e.value
            return e
        if self.children is None:
            raise KeyError(key)
        if isinstance(key, int):
            return self.children[key]
        for c in self.children:
            if c.name == key:
                return c
        for c in self.children:
            if not c.name and c.children is not None and c.kind != "array":
                try:
                    return c[key]
                except KeyError:
                    pass
        raise KeyError(key)


def decode(t: Type, data: bytes, bit_offset: int = 0, bits: int = 0) -> Node:
    """The value of type `t` at `bit_offset` in `data` (`bits`: a bitfield's width). Data shorter than the type
    leaves the members past its end `missing`."""
    try:
        return _Decoder(t.btf, bytes(data)).node(t, "", bit_offset, bits, 0)
    except RecursionError:   # only a corrupt blob has a type inside itself
        raise BTFError(f"dump {t.kind} [{t.id}] {t.name}".rstrip(), "loop of type references") from None


def dump_type_data(t: Type, data: bytes, compact: bool = False, zeroes: bool = False, bit_offset: int = 0,
                   bits: int = 0) -> str:
    """`data` shown as type `t`: `(struct net_device){ .name = (char[16])"lo", .mtu = (unsigned int)65536, ... }`,
    one member per line (tab-indented) or, compact, all on one line; zero members only with `zeroes`."""
    node = decode(t, data, bit_offset, bits)
    return format_node(node, compact, zeroes) + _truncation_note(t, data, bit_offset)


def format_node(node: Node, compact: bool = False, zeroes: bool = False) -> str:
    out: list[str] = []
    _Formatter(out, compact, zeroes).top(node)
    return "".join(out)


def _truncation_note(t: Type, data: bytes, bit_offset: int) -> str:
    try:
        size = t.strip().size
    except BTFError:
        return ""
    have = len(data) - bit_offset // 8
    return f" /* {have} of {size} bytes */" if 0 <= have < size else ""


def type_name(t: Type) -> str:
    """The type as a cast shows it: `struct sk_buff *`, `__u32`, `char[16]`; anonymous structs as `struct`."""
    s = t.strip() if t.kind in ("const", "volatile", "restrict", "type_tag") else t
    if isinstance(s, Composite) and not s.name:
        return s.kind
    if s.kind in ("enum", "enum64") and not s.name:
        return "enum"
    try:
        return c_decl(t)
    except BTFError:
        return t.kind


def is_big_endian(t: Type) -> bool:
    """Declared as __be16/__be32/__be64 (through typedefs and qualifiers): network order in memory."""
    for _ in range(MAX_DEPTH):
        if t.kind not in ("typedef", "const", "volatile", "restrict", "type_tag"):
            return False
        if t.kind == "typedef" and t.name in _BIG_ENDIAN:
            return True
        t = t.target
    return False


class _Plan:
    """How to decode one type id, worked out once per BTF: its cast text, its kind (under typedefs and
    qualifiers) and, per kind, members / element / scalar conversion."""

    __slots__ = ("chars", "conv", "count", "ctype", "elem", "esize", "kind", "members", "nbits", "be", "code")

    def __init__(self, ctype: str, kind: str):
        self.ctype, self.kind = ctype, kind
        self.members: list | None = None    # struct/union: (type id, name, bit offset, bitfield size)
        self.elem, self.count, self.esize, self.chars = 0, 0, 0, False   # array
        self.conv = None                     # scalar: raw -> (value, text)
        self.nbits, self.be, self.code = 0, False, ""


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CODES = {8: "B", 16: "H", 32: "I", 64: "Q"}


def _plan(t: Type) -> _Plan:
    plans = _PLANS.get(t.btf)
    if plans is None:
        plans = _PLANS[t.btf] = {}
    p = plans.get(t.id)
    if p is None:
        p = plans[t.id] = _make_plan(t)
    return p


def _make_plan(t: Type) -> _Plan:
    s = t.strip()
    p = _Plan(type_name(t), s.kind)
    if isinstance(s, Composite):
        p.members = [(m.type_id, m.name, m.bit_offset, m.bitfield_size) for m in s.members]
    elif isinstance(s, Array):
        base = s.elem.strip()
        p.elem, p.count, p.esize = s.elem_id, s.nelems, 8 * _size(base)
        p.chars = isinstance(base, Int) and base.size == 1 and (base.char or base.name in _CHAR_NAMES)
    else:
        p.nbits = 8 * _size(s)
        p.be = p.nbits > 8 and is_big_endian(t)
        p.code = _CODES.get(p.nbits, "")
        p.conv = _converter(s)
    return p


def _converter(s: Type):
    """raw (unsigned, host order), nbits -> (value, text) for a scalar type."""
    if isinstance(s, Enum):
        names = {}
        for k, v in s.values.items():
            names.setdefault(v, k)
        signed = s.signed

        def enum(raw: int, nbits: int):
            v = _signed(raw, nbits) if signed else raw
            name = names.get(v)
            return (name, name) if name is not None else (v, str(v))
        return enum
    if isinstance(s, Int):
        if s.bool:
            return lambda raw, nbits: (bool(raw), "true" if raw else "false")
        if s.signed:
            return lambda raw, nbits: (lambda v: (v, str(v)))(_signed(raw, nbits))
        return lambda raw, nbits: (raw, str(raw))
    if isinstance(s, Ptr):
        return lambda raw, nbits: (raw, f"0x{raw:x}" if raw else "NULL")
    if isinstance(s, Float):
        return _float
    return lambda raw, nbits: (raw, f"0x{raw:x}")   # a long double, or a kind with no value of its own


def _float(raw: int, nbits: int):
    if nbits not in (32, 64):
        return raw, f"0x{raw:x}"
    v = struct.unpack("<f" if nbits == 32 else "<d", raw.to_bytes(nbits // 8, "little"))[0]
    return v, repr(v) if math.isfinite(v) else str(v)


class _Decoder:
    def __init__(self, btf, data: bytes):
        self.btf = btf
        self.data = data
        self.bits = len(data) * 8

    def node(self, t: Type, name: str, off: int, bits: int, depth: int) -> Node:
        return self.planned(_plan(t), name, off, bits, depth)

    def planned(self, p: _Plan, name: str, off: int, bits: int, depth: int) -> Node:
        n = Node(name, p.ctype, p.kind)
        if depth > MAX_DEPTH:
            n.text, n.missing = "...", True
        elif p.members is not None:
            btf = self.btf
            n.children = kids = [self.planned(_plan(btf.type(tid)), mname, off + moff, mbits, depth + 1)
                                 for tid, mname, moff, mbits in p.members]
            n.zero = all(c.zero for c in kids)
            n.missing = bool(kids) and all(c.missing for c in kids)
        elif p.conv is None:
            self.array(n, p, off, depth)
        else:
            nbits = bits or p.nbits
            if nbits == 0 or off + nbits > self.bits:
                n.missing = True
                return n
            raw = self.raw(off, nbits)
            n.zero = raw == 0
            if p.be and not bits:   # shown as the number it stands for
                raw = int.from_bytes(raw.to_bytes(nbits // 8, "little"), "big")
            n.value, n.text = p.conv(raw, nbits)
        return n

    def raw(self, off: int, nbits: int) -> int:
        start, end = off // 8, (off + nbits + 7) // 8
        return (int.from_bytes(self.data[start:end], "little") >> (off % 8)) & ((1 << nbits) - 1)

    def array(self, n: Node, p: _Plan, off: int, depth: int) -> None:
        count, esize = p.count, p.esize
        if count == 0 or esize == 0:   # a flexible array member: nothing of it is in the type's bytes
            n.children, n.zero = [], True
            return
        if off + esize * count > self.bits:
            count = max(0, (self.bits - off) // esize)
            if count == 0:
                n.children, n.missing = [], True
                return
        if p.chars:
            text = self.bytes_at(off, count)
            n.zero = not any(text)
            if _is_string(text):
                n.value = text.split(b"\0", 1)[0].decode("ascii")
                n.text = _quote(n.value)
                return
        ep = _plan(self.btf.type(p.elem))
        if ep.conv is not None and ep.code and off % 8 == 0:   # numbers: all at once
            raws = struct.unpack_from(f"<{count}{ep.code}", self.data, off // 8)
            if ep.be:
                raws = [int.from_bytes(r.to_bytes(ep.nbits // 8, "little"), "big") for r in raws]
            pairs = [ep.conv(r, ep.nbits) for r in raws]
            n.value = [v for v, _ in pairs]
            n.items = [t for _, t in pairs]
            n.elem = ep
            n.used = next((i + 1 for i in range(count - 1, -1, -1) if raws[i]), 0)
            n.zero = n.used == 0
            return
        n.children = [self.planned(ep, "", off + i * esize, 0, depth + 1) for i in range(count)]
        n.zero = all(c.zero for c in n.children)

    def bytes_at(self, off: int, count: int) -> bytes:
        if off % 8 == 0:
            return self.data[off // 8:off // 8 + count]
        return bytes(self.raw(off + 8 * i, 8) for i in range(count))


def _size(t: Type) -> int:
    try:
        return t.size
    except BTFError:   # void, a function: no bytes of their own
        return 0


def _signed(v: int, nbits: int) -> int:
    return v - (1 << nbits) if v >> (nbits - 1) & 1 else v


def _is_string(b: bytes) -> bool:
    """Printable characters, then NULs only (or none): a C string in a char array."""
    text, _, rest = b.partition(b"\0")
    return all(c in _PRINTABLE for c in text) and not any(rest)


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Formatter:
    """libbpf's layout: `(type){` then `.member = (type)value,` per line (one tab deeper per level) and `}`;
    compact: the same without newlines and tabs. Array elements go without names and casts."""

    def __init__(self, out: list[str], compact: bool, zeroes: bool):
        self.out, self.compact, self.zeroes = out, compact, zeroes

    def top(self, n: Node) -> None:
        self.out.append(f"({n.ctype})")
        self.value(n, 0)

    def value(self, n: Node, depth: int) -> None:
        w = self.out.append
        if n.items is not None:
            w("[" + "".join(t + "," for t in (n.items if self.zeroes else n.items[:n.used])) + "]")
            return
        if n.children is None:
            w(n.text if not n.missing else "...")
            return
        is_array = n.kind == "array"
        scalars = is_array and all(c.children is None for c in n.children)
        kids = n.children
        if is_array and not self.zeroes:   # elements keep their places: only trailing zeros go
            end = len(kids)
            while end and kids[end - 1].zero:
                end -= 1
            kids = kids[:end]
        elif not self.zeroes:
            kids = [c for c in kids if not c.zero]
        kids = [c for c in kids if not c.missing]
        w("[" if is_array else "{")
        if scalars:
            w("".join(c.text + "," for c in kids))
        else:
            for c in kids:
                self.member(c, depth + 1, is_array)
            if kids and not self.compact:
                w("\n" + "\t" * depth)
        w("]" if is_array else "}")

    def member(self, c: Node, depth: int, element: bool) -> None:
        w = self.out.append
        if not self.compact:
            w("\n" + "\t" * depth)
        if c.name:
            w(f".{c.name} = ")
        if not element:
            w(f"({c.ctype})")
        self.value(c, depth)
        w(",")
