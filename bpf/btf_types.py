"""BTF types as objects: a record's words read on access, the types it refers to resolved by id."""

from __future__ import annotations

from typing import Protocol

from .errors import BTFError

INT_SIGNED, INT_CHAR, INT_BOOL = 1, 2, 4
LINKAGE = {0: "static", 1: "global", 2: "extern"}
MAX_CHAIN = 256  # longer chains of type references are loops (of a corrupt blob)


class Table(Protocol):
    """What a type reads from the table it belongs to (bpf.btf.BTF is the one), declared here so that the types,
    at the bottom, import nothing above them."""

    words: object              # the type section as u32 words: a type's record starts at its offset
    decl_cache: dict           # bpf.cdecl's C declaration parts by type id

    def string(self, off: int) -> str: ...

    def type(self, type_id: int) -> Type: ...

    def kind_of(self, type_id: int) -> str: ...


class Type:
    """A BTF type: `id`, `name` ("" if anonymous), `kind`, and the `btf` it belongs to."""

    __slots__ = ("btf", "id", "name", "_off", "_memo")
    kind = ""

    def __init__(self, btf: Table, type_id: int, name: str, off: int = 0):
        self.btf, self.id, self.name, self._off, self._memo = btf, type_id, name, off, None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} [{self.id}] {self.name or '(anon)'}>"

    def _word(self, i: int) -> int:
        return self.btf.words[self._off + i]

    kind_flag = property(lambda self: bool(self._word(1) >> 31))
    vlen = property(lambda self: self._word(1) & 0xFFFF)

    @property
    def size(self) -> int:
        raise BTFError(f"size of {self.kind} [{self.id}] {self.name}".rstrip(), "this kind has no size")

    def strip(self) -> Type:
        """The type under any typedef/const/volatile/restrict/type_tag."""
        return self


class Void(Type):
    """Type id 0: no record behind it."""

    __slots__, kind, vlen, kind_flag = (), "void", 0, False


class _Sized(Type):
    __slots__ = ()
    size = property(lambda self: self._word(2))


class Int(_Sized):
    __slots__, kind = (), "int"
    encoding = property(lambda self: self._word(3) >> 24 & 0x0F)
    offset = property(lambda self: self._word(3) >> 16 & 0xFF)
    bits = property(lambda self: self._word(3) & 0xFF)
    signed = property(lambda self: bool(self.encoding & INT_SIGNED))
    char = property(lambda self: bool(self.encoding & INT_CHAR))
    bool = property(lambda self: bool(self.encoding & INT_BOOL))


class Float(_Sized):
    __slots__, kind = (), "float"


class _Ref(Type):
    """A type whose third word is the id of the type it refers to."""

    __slots__ = ()
    target_id = property(lambda self: self._word(2))
    target = property(lambda self: self.btf.type(self._word(2)))


class Ptr(_Ref):
    __slots__, kind, size = (), "ptr", 8


def _size_of(t: Type) -> int:
    """The size of a type through arrays, modifiers and variables, without recursion (a corrupt blob can make
    an array of itself)."""
    n = 1
    for _ in range(MAX_CHAIN):
        if isinstance(t, Array):
            n *= t.nelems
            t = t.elem
        elif isinstance(t, (_Modifier, Var)):
            t = t.target
        else:
            return n * t.size
    raise BTFError(f"size of {t.kind} [{t.id}] {t.name}".rstrip(), "loop of type references")


class _Modifier(_Ref):
    __slots__ = ()
    size = property(_size_of)

    def strip(self) -> Type:
        t = self.target
        for _ in range(MAX_CHAIN):
            if not isinstance(t, _Modifier):
                return t
            t = t.target
        raise BTFError(f"strip {self.kind} [{self.id}] {self.name}".rstrip(), "loop of modifiers")


class Typedef(_Modifier):
    __slots__, kind = (), "typedef"


class Volatile(_Modifier):
    __slots__, kind = (), "volatile"


class Const(_Modifier):
    __slots__, kind = (), "const"


class Restrict(_Modifier):
    __slots__, kind = (), "restrict"


class TypeTag(_Modifier):
    __slots__, kind = (), "type_tag"


class Array(Type):
    __slots__, kind = (), "array"
    elem_id = property(lambda self: self._word(3))
    index_id = property(lambda self: self._word(4))
    nelems = property(lambda self: self._word(5))
    elem = property(lambda self: self.btf.type(self.elem_id))
    index = property(lambda self: self.btf.type(self.index_id))
    size = property(_size_of)


class _Item:
    """A member, parameter or section variable: a `name` and a `type_id`, resolved as `type`."""

    __slots__ = ("btf", "name", "type_id")
    type = property(lambda self: self.btf.type(self.type_id))

    def __repr__(self) -> str:
        more = "".join(f" {k}={getattr(self, k)}" for k in self.__slots__)
        return f"<{type(self).__name__} {self.name or '(anon)'} type=[{self.type_id}]{more}>"


class Member(_Item):
    """A struct/union member: bit_offset from the start of its parent; bitfield_size 0 unless a bitfield."""

    __slots__ = ("bit_offset", "bitfield_size")

    def __init__(self, btf: Table, name: str, type_id: int, bit_offset: int, bitfield_size: int = 0):
        self.btf, self.name, self.type_id, self.bit_offset, self.bitfield_size = (
            btf, name, type_id, bit_offset, bitfield_size)

    offset = property(lambda self: self.bit_offset // 8, doc="byte offset (for a bitfield: of its first byte)")


class Composite(_Sized):
    """A STRUCT or UNION."""

    __slots__ = ()

    @property
    def members(self) -> list[Member]:
        if self._memo is None:
            btf, w, o, kflag, out = self.btf, self.btf.words, self._off, self.kind_flag, []
            for p in range(o + 3, o + 3 + 3 * self.vlen, 3):
                name, tid, bits = btf.string(w[p]), w[p + 1], w[p + 2]
                if kflag:  # the bitfield size is in the high 8 bits of the offset
                    out.append(Member(btf, name, tid, bits & 0xFFFFFF, bits >> 24))
                    continue
                m = Member(btf, name, tid, bits)
                if tid and btf.kind_of(tid) == "int":  # a bitfield encoded the old way, in its INT
                    t = btf.type(tid)
                    if t.offset or t.bits != t.size * 8:
                        m.bit_offset, m.bitfield_size = bits + t.offset, t.bits
                out.append(m)
            self._memo = out
        return self._memo

    def member(self, name: str) -> tuple[Member, int]:
        """The member `name`, also found inside anonymous struct/union members, and its total bit offset."""
        try:
            found = self._find(name, 0)
        except RecursionError:  # only a corrupt blob has a struct inside itself
            found = None
        if found is None:
            raise BTFError(f"member {self.kind} {self.name or '(anon)'}.{name}", "no such member")
        return found

    def _find(self, name: str, base: int) -> tuple[Member, int] | None:
        for m in self.members:
            if m.name == name:
                return m, base + m.bit_offset
        for m in self.members:
            t = m.type.strip() if not m.name else None
            found = t._find(name, base + m.bit_offset) if isinstance(t, Composite) else None
            if found is not None:
                return found
        return None

    def member_path(self, path: str) -> tuple[Member, int]:
        """The member at `a.b.c` through nested (not pointed-to) structs/unions, and its total bit offset."""
        t: Type = self
        m, total = None, 0
        for part in path.split("."):
            s = t.strip()
            if not isinstance(s, Composite):
                raise BTFError(f"member {self.kind} {self.name or '(anon)'}.{path}",
                               f"{m.name!r} is a {s.kind}, not a struct or union")
            m, off = s.member(part)
            total, t = total + off, m.type
        return m, total


class Struct(Composite):
    __slots__, kind = (), "struct"


class Union(Composite):
    __slots__, kind = (), "union"


class Enum(_Sized):
    """An ENUM (or, as subclass Enum64, ENUM64); `values` maps names to values in declaration order."""

    __slots__, kind, _words = (), "enum", 2
    signed = property(lambda self: self.kind_flag)

    @property
    def values(self) -> dict[str, int]:
        if self._memo is None:
            btf, w, o, n = self.btf, self.btf.words, self._off, self._words
            bits = 32 * (n - 1)
            sign = 1 << (bits - 1) if self.signed else 1 << bits
            self._memo = {}
            for p in range(o + 3, o + 3 + n * self.vlen, n):
                v = w[p + 1] | (w[p + 2] << 32 if n == 3 else 0)
                self._memo[btf.string(w[p])] = v - (1 << bits) if v >= sign else v
        return self._memo

    def name_of(self, value: int) -> str | None:
        """The first enumerator with this value, or None."""
        return next((k for k, v in self.values.items() if v == value), None)


class Enum64(Enum):
    __slots__, kind, _words = (), "enum64", 3


class Fwd(Type):
    __slots__, kind = (), "fwd"
    is_union = property(lambda self: self.kind_flag)


class Func(_Ref):
    __slots__, kind = (), "func"
    linkage = property(lambda self: LINKAGE.get(self.vlen, "unknown"))
    proto = property(lambda self: self.target)


class Param(_Item):
    __slots__ = ()

    def __init__(self, btf: Table, name: str, type_id: int):
        self.btf, self.name, self.type_id = btf, name, type_id


class FuncProto(Type):
    """Return type and parameters; a trailing unnamed void parameter is not in `params` but sets `variadic`."""

    __slots__, kind = (), "func_proto"
    ret_id = property(lambda self: self._word(2))
    ret = property(lambda self: self.btf.type(self._word(2)))

    def _raw(self) -> list[tuple[int, int]]:
        w, o = self.btf.words, self._off
        return [(w[p], w[p + 1]) for p in range(o + 3, o + 3 + 2 * (w[o + 1] & 0xFFFF), 2)]

    @property
    def variadic(self) -> bool:
        n = self.vlen
        return n > 0 and self._word(2 * n + 1) == 0 and self._word(2 * n + 2) == 0

    @property
    def params(self) -> list[Param]:
        if self._memo is None:
            raw = self._raw()[:-1 if self.variadic else None]
            self._memo = [Param(self.btf, self.btf.string(n), t) for n, t in raw]
        return self._memo


class Var(_Ref):
    __slots__, kind = (), "var"
    linkage = property(lambda self: LINKAGE.get(self._word(3), "unknown"))
    size = property(_size_of)


class VarSecinfo(_Item):
    __slots__ = ("offset", "size")

    def __init__(self, btf: Table, type_id: int, offset: int, size: int):
        self.btf, self.name, self.type_id, self.offset, self.size = btf, "", type_id, offset, size


class Datasec(_Sized):
    __slots__, kind = (), "datasec"

    @property
    def vars(self) -> list[VarSecinfo]:
        w, o = self.btf.words, self._off
        return [VarSecinfo(self.btf, *w[p:p + 3]) for p in range(o + 3, o + 3 + 3 * self.vlen, 3)]


class DeclTag(_Ref):
    __slots__, kind = (), "decl_tag"
    component_idx = property(lambda self: self._word(3) - (1 << 32) if self._word(3) >> 31 else self._word(3),
                             doc="-1: the tagged type itself; else the index of its member or parameter")
