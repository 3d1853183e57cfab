"""BTF reader: a lazy index over a .BTF blob (vmlinux or split module BTF), typed objects, C declarations."""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Iterator
from enum import IntEnum
from itertools import accumulate, compress

SYSFS_BTF = "/sys/kernel/btf"


class BTFError(Exception):
    """A BTF operation that failed: `op` says what was attempted, `cause` why."""

    def __init__(self, op: str, cause: object):
        super().__init__(op, cause)
        self.op, self.cause = op, cause

    def __str__(self) -> str:
        return f"{self.op}: {self.cause}"


Kind = IntEnum("Kind", "INT PTR ARRAY STRUCT UNION ENUM FWD TYPEDEF VOLATILE CONST RESTRICT FUNC FUNC_PROTO VAR "
                      "DATASEC FLOAT DECL_TAG TYPE_TAG ENUM64")  # BTF_KIND_*, numbered from 1
KIND_NAMES = {k.value: k.name.lower() for k in Kind}
_KIND_CODES = {v: k for k, v in KIND_NAMES.items()}
# Record size in u32 words: 3 common words + fixed extra words + vlen * words per entry; None = invalid kind.
_EXTRA = {Kind.INT: 1, Kind.ARRAY: 3, Kind.VAR: 1, Kind.DECL_TAG: 1}
_PER = {Kind.STRUCT: 3, Kind.UNION: 3, Kind.ENUM: 2, Kind.FUNC_PROTO: 2, Kind.DATASEC: 3, Kind.ENUM64: 3}
_STEP = [(3 + _EXTRA.get(k, 0), _PER.get(k, 0)) if k in KIND_NAMES else None for k in range(32)]
_MODS = frozenset((Kind.TYPEDEF, Kind.VOLATILE, Kind.CONST, Kind.RESTRICT, Kind.TYPE_TAG))
_REFS = _MODS | {Kind.PTR}
_HEADER = {"<": struct.Struct("<HBBIIIII"), ">": struct.Struct(">HBBIIIII")}
INT_SIGNED, INT_CHAR, INT_BOOL = 1, 2, 4
LINKAGE = {0: "static", 1: "global", 2: "extern"}
_MAX_CHAIN = 256  # longer chains of type references are loops (of a corrupt blob)


class BTF:
    """The types of one BTF blob; a split BTF (kernel module) continues the ids and strings of its base."""

    _vmlinux: BTF | None = None
    _modules: dict[str, BTF] = {}

    def __init__(self, name: str, base: BTF | None, words, strs: bytes, offs: list[int], kinds: bytearray):
        self.name, self.base = name, base
        self._w = words          # the type section as u32 words
        self._strs = strs        # this blob's own string section
        self._offs = offs        # word offset of each own type record, indexed by id - _first
        self._kinds = kinds      # kind of each own type, indexed by id - _first
        self._first = len(base) if base is not None else 1
        self._str_first = base._str_first + len(base._strs) if base is not None else 0
        self._cache: dict[int, Type] = {}
        self._str_cache: dict[int, str] = {}
        self._str_found: dict[bytes, list[int]] = {}
        self._names: dict[tuple[str, int | None], list[int]] = {}
        self._name_offs: list[int] | None = None
        self._name_index: dict[bytes, list[int]] | None = None
        self._lookups = 0
        self._by_kind: dict[tuple, list[int]] = {}
        self._refs: tuple[list[int], list[int], dict[int, list[tuple[int, int]]]] | None = None
        self._func_targets: list[int] | None = None
        self._proto_hits: tuple[frozenset, dict[int, list[int]]] = (frozenset(), {})
        self._decls: dict[int, tuple[str, bool] | None] = {}

    @classmethod
    def load(cls, data: bytes, base: BTF | None = None, name: str = "") -> BTF:
        """Parse a raw .BTF blob; `base` for split BTF. Only record offsets are computed here."""
        op = f"parse {name or 'BTF'}"
        data = bytes(data)
        if len(data) < 24:
            raise BTFError(op, f"truncated header ({len(data)} bytes)")
        endian = {b"\x9f\xeb": "<", b"\xeb\x9f": ">"}.get(data[:2])
        if endian is None:
            raise BTFError(op, f"bad magic 0x{int.from_bytes(data[:2], 'little'):04x}")
        _, version, _, hdr_len, type_off, type_len, str_off, str_len = _HEADER[endian].unpack_from(data)
        if version != 1:
            raise BTFError(op, f"unsupported version {version}")
        if not 24 <= hdr_len <= len(data):
            raise BTFError(op, f"bad header length {hdr_len}")
        body = len(data) - hdr_len
        if type_off + type_len > body or str_off + str_len > body:
            raise BTFError(op, f"truncated: sections (types {type_off}+{type_len}, strings {str_off}+{str_len})"
                               f" exceed the {body} bytes after the header")
        if type_len % 4 or type_off % 4:
            raise BTFError(op, f"type section offset {type_off} or length {type_len} not a multiple of 4")
        strs = data[hdr_len + str_off:hdr_len + str_off + str_len]
        if strs and strs[-1] != 0:
            raise BTFError(op, "string section does not end with NUL")
        if base is None and strs[:1] != b"\0":
            raise BTFError(op, "string section does not start with the empty string (split BTF without its base?)")
        section = memoryview(data)[hdr_len + type_off:hdr_len + type_off + type_len]
        if (endian == "<") == (sys.byteorder == "little"):
            words = section.cast("I")
        else:
            words = array("I", section.tobytes())
            words.byteswap()
        first = len(base) if base is not None else 1
        return cls(name, base, words, strs, *_scan(words, op, first))

    @classmethod
    def load_file(cls, path: str, base: BTF | None = None, name: str = "") -> BTF:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise BTFError(f"read {path}", e.strerror or e) from e
        return cls.load(data, base, name or os.path.basename(path))

    @classmethod
    def vmlinux(cls) -> BTF:
        """The kernel's BTF, /sys/kernel/btf/vmlinux, loaded once per process."""
        if BTF._vmlinux is None:
            BTF._vmlinux = cls.load_file(os.path.join(SYSFS_BTF, "vmlinux"), name="vmlinux")
        return BTF._vmlinux

    @classmethod
    def module(cls, name: str) -> BTF:
        """A kernel module's split BTF, /sys/kernel/btf/<name> on top of vmlinux, loaded once per process."""
        if not name or "/" in name or name in (".", "..", "vmlinux"):
            raise BTFError(f"load module BTF {name!r}", "not a module name")
        if name not in BTF._modules:
            BTF._modules[name] = cls.load_file(os.path.join(SYSFS_BTF, name), cls.vmlinux(), name)
        return BTF._modules[name]

    @staticmethod
    def module_names() -> list[str]:
        """Modules with BTF: the names in /sys/kernel/btf except vmlinux."""
        try:
            return sorted(n for n in os.listdir(SYSFS_BTF) if n != "vmlinux")
        except OSError:
            return []

    # -- types by id ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._first + len(self._offs)

    def __repr__(self) -> str:
        return f"<BTF {self.name or '(anon)'} ids {self._first}..{len(self) - 1}>"

    def ids(self) -> range:
        """This object's own type ids (not its base's)."""
        return range(self._first, len(self))

    def type(self, type_id: int) -> Type:
        """The type with this id; 0 is void, ids below the base's count are the base's."""
        t = self._cache.get(type_id)
        if t is None:
            if type_id < self._first and self.base is not None:
                return self.base.type(type_id)
            if type_id == 0:
                t = Void(self, 0, "")
            else:
                i = self._index(type_id)
                o = self._offs[i]
                t = _CLASSES[self._kinds[i]](self, type_id, self._str(self._w[o]), o)
            self._cache[type_id] = t
        return t

    def kind_of(self, type_id: int) -> str:
        """The kind of a type id, without building its object."""
        if type_id < self._first:
            return self.base.kind_of(type_id) if self.base is not None else self.type(type_id).kind
        return KIND_NAMES[self._kinds[self._index(type_id)]]

    def types(self, kind: str | None = None) -> Iterator[Type]:
        """This object's own types, optionally of one kind, in id order."""
        ids = self.ids() if kind is None else self._ids_of(_kind_code(kind))
        return (self.type(i) for i in ids)

    def _index(self, type_id: int) -> int:
        i = type_id - self._first
        if not 0 <= i < len(self._offs):
            raise BTFError(f"type {self.name or 'BTF'}", f"id {type_id} out of range 0..{len(self) - 1}")
        return i

    def _selector(self, kinds) -> bytes:
        """A byte per own type, 1 where its kind is in `kinds`: for itertools.compress."""
        return self._kinds.translate(bytes(k in kinds for k in range(256)))

    def _ids_of(self, *kinds: int) -> list[int]:
        """Own ids of these kinds, in order."""
        if kinds not in self._by_kind:
            self._by_kind[kinds] = list(compress(self.ids(), self._selector(kinds)))
        return self._by_kind[kinds]

    def _str(self, off: int) -> str:
        s = self._str_cache.get(off)
        if s is None:
            if off < self._str_first:
                return self.base._str(off)
            o = off - self._str_first
            end = self._strs.find(b"\0", o)
            if end < 0:
                raise BTFError(f"string {self.name or 'BTF'}", f"offset {off} out of range")
            s = self._str_cache[off] = self._strs[o:end].decode("utf-8", "replace")
        return s

    def _str_offsets(self, prefix: bytes, whole: bool) -> list[int]:
        """Offsets, in this chain's string space, of the strings equal to (or starting with) `prefix`."""
        out = [] if self.base is None else self.base._str_offsets(prefix, whole)
        pat, strs, pos = b"\0" + prefix + (b"\0" if whole else b""), self._strs, -1
        if self.base is not None and strs.startswith(pat[1:]):  # a split section need not begin with NUL
            out.append(self._str_first)
        found = self._str_found.get(pat)
        if found is None:
            found = []
            while True:
                pos = strs.find(pat, pos + 1)
                if pos < 0:
                    break
                found.append(self._str_first + pos + 1)
            if len(self._str_found) < 64:  # a base's answers serve every module on top of it
                self._str_found[pat] = found
        return out + found

    # -- by name ----------------------------------------------------------------------------------------

    def find(self, name: str, kind: str | None = None) -> Type | None:
        """The type named `name` (of `kind`, e.g. "struct", "func", "typedef") with the lowest id, or None."""
        found = self.find_all(name, kind)
        return found[0] if found else None

    def find_all(self, name: str, kind: str | None = None) -> list[Type]:
        """All types named `name` (of `kind`), the base's first, in id order."""
        code = None if kind is None else _kind_code(kind)
        out = [] if self.base is None else self.base.find_all(name, kind)
        key = (name, code)
        if key not in self._names:
            ids = self._ids_named(name) if name else []
            self._names[key] = [i for i in ids if code is None or self._kinds[i - self._first] == code]
        return out + [self.type(i) for i in self._names[key]]

    def _ids_named(self, name: str) -> list[int]:
        """Own ids named `name`: a few lookups scan (at C speed); after many, a full index pays off."""
        if self._name_index is None:
            w = self._w
            if self._name_offs is None:
                self._name_offs = [w[o] for o in self._offs]
            self._lookups += 1
            if self._lookups <= 32:
                offs = self._str_offsets(name.encode(), True)
                return sorted(i for off in offs for i in _positions(self._name_offs, off, self._first))
            by_off: dict[int, list[int]] = {}
            for i, off in enumerate(self._name_offs, self._first):
                by_off.setdefault(off, []).append(i)
            parts = self._strs.split(b"\0")
            strings = dict(zip(accumulate([len(p) + 1 for p in parts], initial=self._str_first), parts))
            self._name_index = {strings[off] if off in strings else self._str(off).encode(): ids
                                for off, ids in by_off.items()}
        return self._name_index.get(name.encode(), [])

    # -- scans ------------------------------------------------------------------------------------------

    def funcs(self) -> Iterator[Func]:
        """This object's own FUNC types (not its base's), in id order."""
        return (self.type(i) for i in self._ids_of(Kind.FUNC))

    def funcs_taking_pointer_to(self, struct_name: str) -> list[tuple[Func, list[int]]]:
        """Own FUNCs with `struct struct_name *` parameters (through modifiers), with those parameters' indices."""
        seeds = {t.id for t in self.find_all(struct_name) if t.kind == "struct" or (t.kind == "fwd" and not t.is_union)}
        ptrs = {i for t in self._referrers(seeds, _MODS) for i, k in self._rev(t) if k == Kind.PTR}
        if not ptrs:
            return []
        wanted = frozenset(self._referrers(ptrs, _MODS))
        hits: dict[int, list[int]] = {}
        btf: BTF | None = self
        while btf is not None:  # a module's FUNC may use a FUNC_PROTO of its base
            hits.update(btf._protos_with_params_in(frozenset(i for i in wanted if i < len(btf))))
            btf = btf.base
        if self._func_targets is None:
            w = self._w
            self._func_targets = [w[o + 2] for o in compress(self._offs, self._selector((Kind.FUNC,)))]
        ids = compress(self._ids_of(Kind.FUNC), map(hits.__contains__, self._func_targets))
        return [(f, hits[f.target_id]) for f in map(self.type, ids)]

    def typedefs_to_func_proto(self, prefix: str) -> list[tuple[str, FuncProto]]:
        """Own typedefs named `prefix...` that are pointers to a FUNC_PROTO (e.g. prefix "btf_trace_")."""
        names = set(self._str_offsets(prefix.encode(), False))
        w, offs, first, out = self._w, self._offs, self._first, []
        for i in self._ids_of(Kind.TYPEDEF) if names else ():
            o = offs[i - first]
            if w[o] in names:
                ptr = self.type(w[o + 2]).strip()
                proto = ptr.target.strip() if isinstance(ptr, Ptr) else None
                if isinstance(proto, FuncProto):
                    out.append((self._str(w[o]), proto))
        return out

    def _rev(self, type_id: int) -> list[tuple[int, int]]:
        """(id, kind) of the PTR and modifier types, in this chain, whose target is `type_id`."""
        out: list[tuple[int, int]] = []
        btf: BTF | None = self
        while btf is not None:
            if btf._refs is None:
                sel, w = btf._selector(_REFS), btf._w
                btf._refs = (list(compress(btf.ids(), sel)), [w[o + 2] for o in compress(btf._offs, sel)], {})
            ids, targets, memo = btf._refs
            if type_id not in memo:
                memo[type_id] = [(ids[j], btf._kinds[ids[j] - btf._first]) for j in _positions(targets, type_id, 0)]
            out += memo[type_id]
            btf = btf.base
        return out

    def _referrers(self, seeds: set[int], via: frozenset) -> set[int]:
        """`seeds` and every type that reaches one of them through types of the kinds in `via`."""
        result, todo = set(seeds), list(seeds)
        while todo:
            for i, k in self._rev(todo.pop()):
                if k in via and i not in result:
                    result.add(i)
                    todo.append(i)
        return result

    def _protos_with_params_in(self, wanted: frozenset) -> dict[int, list[int]]:
        """Own FUNC_PROTO ids with parameters whose type is in `wanted` -> indices of those parameters."""
        if self._proto_hits[0] != wanted:
            w, offs, first, disjoint, hits = self._w, self._offs, self._first, wanted.isdisjoint, {}
            for i in self._ids_of(Kind.FUNC_PROTO):
                o = offs[i - first]
                params = w[o + 4:o + 4 + 2 * (w[o + 1] & 0xFFFF):2]
                if not disjoint(params):
                    hits[i] = [j for j, t in enumerate(params) if t in wanted]
            self._proto_hits = (wanted, hits)
        return self._proto_hits[1]


def _scan(w, op: str, first: int) -> tuple[list[int], bytearray]:
    """The one pass over the type section: word offset and kind of every record."""
    offs: list[int] = []
    kinds = bytearray()
    add_off, add_kind, step = offs.append, kinds.append, _STEP
    i, n, k = 0, len(w), 0
    try:
        while i < n:
            info = w[i + 1]
            k = (info >> 24) & 0x1F
            fixed, per = step[k]
            add_off(i)
            add_kind(k)
            i += fixed + (info & 0xFFFF) * per
    except TypeError:
        raise BTFError(op, f"type [{first + len(offs)}]: unknown kind {k}") from None
    except IndexError:
        raise BTFError(op, f"type [{first + len(offs)}]: truncated record") from None
    if i != n:
        raise BTFError(op, f"type [{first + len(offs) - 1}]: truncated record")
    return offs, kinds


def _positions(values: list[int], value: int, start: int) -> list[int]:
    """Indices (+ start) where `value` occurs in `values`, found with list.index."""
    out, i = [], -1
    while True:
        try:
            i = values.index(value, i + 1)
        except ValueError:
            return out
        out.append(start + i)


def _kind_code(kind: str) -> int:
    if kind not in _KIND_CODES:
        raise BTFError("find", f"unknown kind {kind!r}; kinds are {', '.join(_KIND_CODES)}")
    return _KIND_CODES[kind]


# -- types: a record's own words are read on access; the types it refers to are ids, resolved through `btf` --


class Type:
    """A BTF type: `id`, `name` ("" if anonymous), `kind`, and the `btf` it belongs to."""

    __slots__ = ("btf", "id", "name", "_off", "_memo")
    kind = ""

    def __init__(self, btf: BTF, type_id: int, name: str, off: int = 0):
        self.btf, self.id, self.name, self._off, self._memo = btf, type_id, name, off, None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} [{self.id}] {self.name or '(anon)'}>"

    def _word(self, i: int) -> int:
        return self.btf._w[self._off + i]

    kind_flag = property(lambda self: bool(self._word(1) >> 31))
    vlen = property(lambda self: self._word(1) & 0xFFFF)

    @property
    def size(self) -> int:
        raise BTFError(f"size of {self.kind} [{self.id}] {self.name}".rstrip(), "this kind has no size")

    def strip(self) -> Type:
        """The type under any typedef/const/volatile/restrict/type_tag."""
        return self

    def c_decl(self, name: str = "") -> str:
        return c_decl(self, name)


class Void(Type):
    __slots__, kind = (), "void"


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


class _Modifier(_Ref):
    __slots__ = ()
    size = property(lambda self: self.strip().size)

    def strip(self) -> Type:
        t = self.target
        for _ in range(_MAX_CHAIN):
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
    size = property(lambda self: self.elem.size * self.nelems)


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

    def __init__(self, btf: BTF, name: str, type_id: int, bit_offset: int, bitfield_size: int = 0):
        self.btf, self.name, self.type_id, self.bit_offset, self.bitfield_size = (
            btf, name, type_id, bit_offset, bitfield_size)

    offset = property(lambda self: self.bit_offset // 8, doc="byte offset (for a bitfield: of its first byte)")


class Composite(_Sized):
    """A STRUCT or UNION."""

    __slots__ = ()

    @property
    def members(self) -> list[Member]:
        if self._memo is None:
            btf, w, o, kflag, out = self.btf, self.btf._w, self._off, self.kind_flag, []
            for p in range(o + 3, o + 3 + 3 * self.vlen, 3):
                name, tid, bits = btf._str(w[p]), w[p + 1], w[p + 2]
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
            btf, w, o, n = self.btf, self.btf._w, self._off, self._words
            bits = 32 * (n - 1)
            sign = 1 << (bits - 1) if self.signed else 1 << bits
            self._memo = {}
            for p in range(o + 3, o + 3 + n * self.vlen, n):
                v = w[p + 1] | (w[p + 2] << 32 if n == 3 else 0)
                self._memo[btf._str(w[p])] = v - (1 << bits) if v >= sign else v
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

    def c_prototype(self) -> str:
        """E.g. `int ip_send_skb(struct net *net, struct sk_buff *skb)`."""
        return c_decl(self)


class Param(_Item):
    __slots__ = ()

    def __init__(self, btf: BTF, name: str, type_id: int):
        self.btf, self.name, self.type_id = btf, name, type_id


class FuncProto(Type):
    """Return type and parameters; a trailing unnamed void parameter is not in `params` but sets `variadic`."""

    __slots__, kind = (), "func_proto"
    ret_id = property(lambda self: self._word(2))
    ret = property(lambda self: self.btf.type(self._word(2)))

    def _raw(self) -> list[tuple[int, int]]:
        w, o = self.btf._w, self._off
        return [(w[p], w[p + 1]) for p in range(o + 3, o + 3 + 2 * (w[o + 1] & 0xFFFF), 2)]

    @property
    def variadic(self) -> bool:
        n = self.vlen
        return n > 0 and self._word(2 * n + 1) == 0 and self._word(2 * n + 2) == 0

    @property
    def params(self) -> list[Param]:
        if self._memo is None:
            raw = self._raw()[:-1 if self.variadic else None]
            self._memo = [Param(self.btf, self.btf._str(n), t) for n, t in raw]
        return self._memo


class Var(_Ref):
    __slots__, kind = (), "var"
    linkage = property(lambda self: LINKAGE.get(self._word(3), "unknown"))
    size = property(lambda self: self.target.size)


class VarSecinfo(_Item):
    __slots__ = ("offset", "size")

    def __init__(self, btf: BTF, type_id: int, offset: int, size: int):
        self.btf, self.name, self.type_id, self.offset, self.size = btf, "", type_id, offset, size


class Datasec(_Sized):
    __slots__, kind = (), "datasec"

    @property
    def vars(self) -> list[VarSecinfo]:
        w, o = self.btf._w, self._off
        return [VarSecinfo(self.btf, *w[p:p + 3]) for p in range(o + 3, o + 3 + 3 * self.vlen, 3)]


class DeclTag(_Ref):
    __slots__, kind = (), "decl_tag"
    component_idx = property(lambda self: self._word(3) - (1 << 32) if self._word(3) >> 31 else self._word(3),
                             doc="-1: the tagged type itself; else the index of its member or parameter")


_CLASSES: list = [None] * 32
for _cls in (Int, Ptr, Array, Struct, Union, Enum, Fwd, Typedef, Volatile, Const, Restrict, Func, FuncProto,
             Var, Datasec, Float, DeclTag, TypeTag, Enum64):
    _CLASSES[_KIND_CODES[_cls.kind]] = _cls


# -- C declarations, by the rules of libbpf's btf_dump (what `bpftool btf dump ... format c` writes) ---------


def c_decl(t: Type, name: str = "") -> str:
    """C declaration of `name` as type `t`: `struct sk_buff *skb`, `int (*fn)(int)`, `char name[16]`."""
    try:
        if isinstance(t, (Func, Var)):
            return _decl(t.btf, t.target_id, name or t.name)
        return _decl(t.btf, t.id, name)
    except RecursionError:  # only a corrupt blob has a type that contains itself
        raise BTFError(f"declare {t.kind} [{t.id}] {t.name}".rstrip(), "loop of type references") from None


_MISSING = ("", False)
_QUALIFIERS = ("volatile", "const", "restrict")


def _decl(btf: BTF, type_id: int, name: str) -> str:
    parts, params = _parts(btf, type_id), ""
    if parts is None:
        t = btf.type(type_id)
        parts = _parts(btf, t.ret_id) if isinstance(t, FuncProto) else None
        if parts is None:
            out: list[str] = []
            _chain(_stack(t), name, out)
            return "".join(out)
        params = _params(t)  # a function whose return type is simple: name and parameters follow it
    text, last_was_ptr = parts
    return (text + " " + name if name and not last_was_ptr else text + name) + params


def _parts(btf: BTF, type_id: int) -> tuple[str, bool] | None:
    """(declaration without a name, whether it ends in `*`), cached; None where the name goes inside."""
    parts = btf._decls.get(type_id, _MISSING)
    if parts is _MISSING:
        stack = _stack(btf.type(type_id))
        parts = None
        if not any(isinstance(s, (Array, FuncProto)) for s in stack):
            out: list[str] = []
            last_was_ptr = _chain(stack, "", out)
            parts = ("".join(out), last_was_ptr)
        btf._decls[type_id] = parts
    return parts


def _stack(t: Type) -> list[Type]:
    """The declarator chain from `t` (outermost) to the type that names it (innermost)."""
    stack = [t]
    while isinstance(t, (Ptr, Volatile, Const, Restrict, TypeTag, Array, FuncProto)):
        t = t.elem if isinstance(t, Array) else t.ret if isinstance(t, FuncProto) else t.target
        stack.append(t)
        if len(stack) > _MAX_CHAIN:
            raise BTFError(f"declare {stack[0].kind} [{stack[0].id}]", "loop of type references")
    return stack


def _params(t: FuncProto) -> str:
    btf, raw = t.btf, t._raw()
    variadic = t.variadic
    if variadic:
        raw.pop()
    if not raw:
        return "(void)"
    decls = [_decl(btf, tid, btf._str(name_off) if name_off else "") for name_off, tid in raw]
    return "(" + ", ".join(decls + ["..."] if variadic else decls) + ")"


def _mods(stack: list[Type], out: list[str] | None) -> None:
    """Pop the qualifiers right above a named type; write them before it (or drop them if out is None)."""
    while stack and stack[-1].kind in _QUALIFIERS:
        kind = stack.pop().kind
        if out is not None:
            out.append(kind + " ")


def _chain(stack: list[Type], fname: str, out: list[str]) -> bool:
    """Write a declarator chain (innermost first); True if it ended in `*`, so a name needs no space."""
    last_was_ptr = True
    while stack:
        t = stack.pop()
        kind = t.kind
        if kind in ("void", "int", "float", "typedef"):
            _mods(stack, out)
            out.append(t.name or kind)
        elif kind in ("struct", "union", "enum", "enum64", "fwd"):
            _mods(stack, out)
            word = "enum" if kind == "enum64" else ("union" if t.is_union else "struct") if kind == "fwd" else kind
            out.append(f"{word} {t.name}" if t.name else word + (" {...}" if kind != "fwd" and t.vlen else " {}"))
        elif kind == "ptr":
            out.append("*" if last_was_ptr else " *")
        elif kind in _QUALIFIERS:
            out.append(" " + kind)
        elif kind == "type_tag":
            _mods(stack, out)
            out.append(f' __attribute__((btf_type_tag("{t.name}")))')
        elif kind == "array":
            _mods(stack, None)  # qualifiers of an array itself mean nothing; GCC emits them, libbpf drops them
            if not stack:
                out.append(" " + fname if fname and not last_was_ptr else fname)
            else:
                multidim = stack[-1].kind == "array"
                out.append(" " if fname and not last_was_ptr else "")
                out.append("" if multidim else "(")
                _chain(stack, fname, out)
                out.append("" if multidim else ")")
            out.append(f"[{t.nelems}]")
            return False
        elif kind == "func_proto":
            _mods(stack, None)
            if stack:
                out.append(" (")
                _chain(stack, fname, out)
                out.append(")")
            else:
                out.append(" " + fname if fname and not last_was_ptr else fname)
            out.append(_params(t))
            return False
        else:
            raise BTFError(f"declare {fname or '(anon)'}", f"{kind} [{t.id}] cannot appear in a declarator")
        last_was_ptr = kind == "ptr"
    out.append(" " + fname if fname and not last_was_ptr else fname)
    return last_was_ptr
