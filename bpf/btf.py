"""BTF reader: a lazy index over a .BTF blob (vmlinux or split module BTF), typed objects, C declarations."""

from __future__ import annotations

import os
import struct
import sys
from array import array
from enum import IntEnum
from itertools import compress
from typing import Iterator

SYSFS_BTF = "/sys/kernel/btf"
MAGIC = 0xEB9F


class BTFError(Exception):
    """A BTF operation that failed: `op` says what was attempted, `cause` why."""

    def __init__(self, op: str, cause: object):
        super().__init__(op, cause)
        self.op = op
        self.cause = cause

    def __str__(self) -> str:
        return f"{self.op}: {self.cause}"


class Kind(IntEnum):
    INT = 1
    PTR = 2
    ARRAY = 3
    STRUCT = 4
    UNION = 5
    ENUM = 6
    FWD = 7
    TYPEDEF = 8
    VOLATILE = 9
    CONST = 10
    RESTRICT = 11
    FUNC = 12
    FUNC_PROTO = 13
    VAR = 14
    DATASEC = 15
    FLOAT = 16
    DECL_TAG = 17
    TYPE_TAG = 18
    ENUM64 = 19


KIND_NAMES = {k.value: k.name.lower() for k in Kind}
_KIND_BY_NAME = {v: k for k, v in KIND_NAMES.items()}

# Words (u32) per record: 3 common words + fixed extra words, + vlen * words per vlen entry.
_EXTRA = {Kind.INT: 1, Kind.ARRAY: 3, Kind.VAR: 1, Kind.DECL_TAG: 1}
_PER = {Kind.STRUCT: 3, Kind.UNION: 3, Kind.ENUM: 2, Kind.FUNC_PROTO: 2, Kind.DATASEC: 3, Kind.ENUM64: 3}
_STEP = [None] * 32  # kind -> (fixed words, words per vlen entry); None marks an invalid kind
for _k in Kind:
    _STEP[_k] = (3 + _EXTRA.get(_k, 0), _PER.get(_k, 0))

_MODS = frozenset((Kind.TYPEDEF, Kind.VOLATILE, Kind.CONST, Kind.RESTRICT, Kind.TYPE_TAG))
_REFS = _MODS | {Kind.PTR}
_HEADER = {"<": struct.Struct("<HBBIIIII"), ">": struct.Struct(">HBBIIIII")}

INT_SIGNED, INT_CHAR, INT_BOOL = 1, 2, 4
LINKAGE = {0: "static", 1: "global", 2: "extern"}


class BTF:
    """Types of one BTF blob; a split BTF (kernel module) continues the ids and strings of its base."""

    _vmlinux: BTF | None = None
    _modules: dict[str, BTF] = {}

    def __init__(self, name: str, base: BTF | None, words, strs: bytes, offs: list[int], kinds: bytearray):
        self.name = name
        self.base = base
        self._w = words                  # type section as u32 words
        self._strs = strs                # this blob's own string section
        self._offs = offs                # word offset of each own type, by id - first
        self._kinds = kinds              # kind of each own type, by id - first
        self._first = len(base) if base is not None else 1
        self._str_first = (base._str_first + len(base._strs)) if base is not None else 0
        self._cache: dict[int, Type] = {}
        self._names: dict[tuple[str, int | None], list[int]] = {}
        self._name_offs: list[int] | None = None
        self._name_index: dict[int, list[int]] | None = None
        self._lookups = 0
        self._rev: dict[int, list[tuple[int, int]]] | None = None
        self._proto_hits: tuple[frozenset, dict[int, list[int]]] | None = None

    # -- loading -----------------------------------------------------------------------------------

    @classmethod
    def load(cls, data: bytes, base: BTF | None = None, name: str = "") -> BTF:
        op = f"parse {name or 'BTF'}"
        data = bytes(data)
        if len(data) < 24:
            raise BTFError(op, f"truncated header ({len(data)} bytes)")
        if data[:2] == b"\x9f\xeb":
            endian = "<"
        elif data[:2] == b"\xeb\x9f":
            endian = ">"
        else:
            raise BTFError(op, f"bad magic 0x{int.from_bytes(data[:2], 'little'):04x}")
        _, version, _, hdr_len, type_off, type_len, str_off, str_len = _HEADER[endian].unpack_from(data)
        if version != 1:
            raise BTFError(op, f"unsupported version {version}")
        if hdr_len < 24 or hdr_len > len(data):
            raise BTFError(op, f"bad header length {hdr_len}")
        body = len(data) - hdr_len
        if type_off + type_len > body or str_off + str_len > body:
            raise BTFError(op, f"sections (types {type_off}+{type_len}, strings {str_off}+{str_len}) "
                               f"exceed {body} bytes of data")
        if type_len % 4 or type_off % 4:
            raise BTFError(op, f"type section offset/length {type_off}/{type_len} not a multiple of 4")
        strs = data[hdr_len + str_off:hdr_len + str_off + str_len]
        if strs and strs[-1] != 0:
            raise BTFError(op, "string section is not NUL-terminated")
        if base is None and strs[:1] != b"\0":
            raise BTFError(op, "string section does not start with an empty string")
        section = memoryview(data)[hdr_len + type_off:hdr_len + type_off + type_len]
        if (endian == "<") == (sys.byteorder == "little"):
            words = section.cast("I")
        else:
            words = array("I", section.tobytes())
            words.byteswap()
        offs, kinds = _scan(words, op)
        return cls(name, base, words, strs, offs, kinds)

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
        if cls._vmlinux is None:
            BTF._vmlinux = cls.load_file(os.path.join(SYSFS_BTF, "vmlinux"), name="vmlinux")
        return cls._vmlinux

    @classmethod
    def module(cls, name: str) -> BTF:
        if not name or "/" in name or name in (".", "..", "vmlinux"):
            raise BTFError(f"load module BTF {name!r}", "not a module name")
        btf = cls._modules.get(name)
        if btf is None:
            btf = cls.load_file(os.path.join(SYSFS_BTF, name), base=cls.vmlinux(), name=name)
            cls._modules[name] = btf
        return btf

    @staticmethod
    def module_names() -> list[str]:
        try:
            return sorted(n for n in os.listdir(SYSFS_BTF) if n != "vmlinux")
        except OSError:
            return []

    # -- types by id -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._first + len(self._offs)

    def __repr__(self) -> str:
        return f"<BTF {self.name or '(anon)'} ids {self._first}..{len(self) - 1}>"

    def ids(self) -> range:
        """This object's own type ids (not its base's)."""
        return range(self._first, len(self))

    def kind_of(self, type_id: int) -> str:
        """The kind of a type id, without building the type object."""
        if type_id < self._first:
            return self.base.kind_of(type_id) if self.base is not None and type_id >= 0 else self.type(type_id).kind
        return KIND_NAMES[self._kinds[self._index(type_id)]]

    def type(self, type_id: int) -> Type:
        t = self._cache.get(type_id)
        if t is not None:
            return t
        if type_id < self._first:
            if self.base is not None:
                return self.base.type(type_id)
            if type_id == 0:
                t = self._cache[0] = Void(self, 0, "")
                return t
        i = self._index(type_id)
        o = self._offs[i]
        t = _CLASSES[self._kinds[i]](self, type_id, self._str(self._w[o]), o)
        self._cache[type_id] = t
        return t

    def types(self, kind: str | None = None) -> Iterator[Type]:
        """This object's own types, optionally of one kind, in id order."""
        if kind is None:
            return (self.type(i) for i in self.ids())
        return (self.type(i) for i in self._own_ids_of(_kind_code(kind)))

    def _index(self, type_id: int) -> int:
        i = type_id - self._first
        if i < 0 or i >= len(self._offs):
            raise BTFError(f"type {self.name or 'BTF'}", f"id {type_id!r} out of range 0..{len(self) - 1}")
        return i

    def _own_ids_of(self, *kinds: int) -> list[int]:
        first = self._first
        if len(kinds) == 1:
            flags = map(kinds[0].__eq__, self._kinds)
        else:
            flags = map(frozenset(kinds).__contains__, self._kinds)
        return [first + i for i in compress(range(len(self._kinds)), flags)]

    def _str(self, off: int) -> str:
        if off < self._str_first:
            return self.base._str(off)
        o = off - self._str_first
        end = self._strs.find(b"\0", o)
        if o >= len(self._strs) or end < 0:
            raise BTFError(f"string {self.name or 'BTF'}", f"offset {off} out of range")
        return self._strs[o:end].decode("utf-8", "replace")

    def _str_offsets(self, prefix: bytes, whole: bool) -> list[int]:
        """Offsets (in this chain's string space) of strings equal to / starting with `prefix`."""
        out = [] if self.base is None else self.base._str_offsets(prefix, whole)
        pat = b"\0" + prefix + (b"\0" if whole else b"")
        strs, pos = self._strs, -1
        if self.base is not None and strs.startswith(pat[1:]):  # a split section need not begin with "\0"
            out.append(self._str_first)
        while True:
            pos = strs.find(pat, pos + 1)
            if pos < 0:
                return out
            out.append(self._str_first + pos + 1)

    # -- lookups by name ---------------------------------------------------------------------------

    def find(self, name: str, kind: str | None = None) -> Type | None:
        """The first type (lowest id, base first) named `name`, optionally of one kind, or None."""
        found = self.find_all(name, kind)
        return found[0] if found else None

    def find_all(self, name: str, kind: str | None = None) -> list[Type]:
        code = None if kind is None else _kind_code(kind)
        out = [] if self.base is None else self.base.find_all(name, kind)
        return out + [self.type(i) for i in self._own_ids_named(name, code)]

    def _own_ids_named(self, name: str, code: int | None) -> list[int]:
        key = (name, code)
        ids = self._names.get(key)
        if ids is None:
            ids = []
            for off in (self._str_offsets(name.encode(), True) if name else ()):
                ids.extend(self._ids_with_name_off(off))
            ids.sort()
            if code is not None:
                ids = [i for i in ids if self._kinds[i - self._first] == code]
            self._names[key] = ids
        return ids

    def _ids_with_name_off(self, off: int) -> list[int]:
        if self._name_offs is None:
            w = self._w
            self._name_offs = [w[o] for o in self._offs]
        self._lookups += 1
        if self._name_index is None and self._lookups > 32:  # many lookups: one full index pays off
            index: dict[int, list[int]] = {}
            for i, n in enumerate(self._name_offs):
                if n:
                    index.setdefault(n, []).append(i)
            self._name_index = index
        if self._name_index is not None:
            return [self._first + i for i in self._name_index.get(off, ())]
        out, i, names = [], -1, self._name_offs
        while True:
            try:
                i = names.index(off, i + 1)
            except ValueError:
                return out
            out.append(self._first + i)

    # -- scans ----------------------------------------------------------------------------------------

    def funcs(self) -> Iterator[Func]:
        """This object's own FUNC types (not its base's), in id order."""
        return (self.type(i) for i in self._own_ids_of(Kind.FUNC))

    def funcs_taking_pointer_to(self, struct_name: str) -> list[tuple[Func, list[int]]]:
        """Own FUNCs with parameters of type `struct struct_name *` (through modifiers), with their indices."""
        seeds = {t.id for t in self.find_all(struct_name)
                 if t.kind == "struct" or (t.kind == "fwd" and not t.is_union)}
        if not seeds:
            return []
        to_struct = self._referrers(seeds, _MODS)
        ptrs = {i for t in to_struct for i, k in self._rev_lookup(t) if k == Kind.PTR}
        wanted = frozenset(self._referrers(ptrs, _MODS))
        hits: dict[int, list[int]] = {}
        btf: BTF | None = self
        while btf is not None:
            hits.update(btf._protos_with_params_in(wanted))
            btf = btf.base
        if not hits:
            return []
        w, offs, first = self._w, self._offs, self._first
        out = []
        for i in self._own_ids_of(Kind.FUNC):
            idx = hits.get(w[offs[i - first] + 2])
            if idx is not None:
                out.append((self.type(i), idx))
        return out

    def typedefs_to_func_proto(self, prefix: str) -> list[tuple[str, FuncProto]]:
        """Own typedefs named `prefix...` that are pointers to a FUNC_PROTO, e.g. prefix "btf_trace_"."""
        names = set(self._str_offsets(prefix.encode(), False))
        if not names:
            return []
        w, offs, first = self._w, self._offs, self._first
        out = []
        for i in self._own_ids_of(Kind.TYPEDEF):
            o = offs[i - first]
            if w[o] in names:
                target = self.type(w[o + 2]).strip()
                if isinstance(target, Ptr):
                    proto = target.target.strip()
                    if isinstance(proto, FuncProto):
                        out.append((self._str(w[o]), proto))
        return out

    def _rev_lookup(self, type_id: int) -> list[tuple[int, int]]:
        """(id, kind) of PTR/modifier types in this chain whose target is `type_id`."""
        out: list[tuple[int, int]] = []
        btf: BTF | None = self
        while btf is not None:
            if btf._rev is None:
                rev: dict[int, list[tuple[int, int]]] = {}
                w, offs, kinds, first = btf._w, btf._offs, btf._kinds, btf._first
                for i in btf._own_ids_of(*_REFS):
                    rev.setdefault(w[offs[i - first] + 2], []).append((i, kinds[i - first]))
                btf._rev = rev
            out.extend(btf._rev.get(type_id, ()))
            btf = btf.base
        return out

    def _referrers(self, seeds: set[int], via: frozenset) -> set[int]:
        """`seeds` plus every type that reaches one of them through kinds in `via`."""
        result, todo = set(seeds), list(seeds)
        while todo:
            for i, k in self._rev_lookup(todo.pop()):
                if k in via and i not in result:
                    result.add(i)
                    todo.append(i)
        return result

    def _protos_with_params_in(self, wanted: frozenset) -> dict[int, list[int]]:
        """Own FUNC_PROTO ids with parameters whose type id is in `wanted` -> those parameter indices."""
        if self._proto_hits is not None and self._proto_hits[0] == wanted:
            return self._proto_hits[1]
        w, offs, first = self._w, self._offs, self._first
        disjoint = wanted.isdisjoint
        hits = {}
        for i in self._own_ids_of(Kind.FUNC_PROTO):
            o = offs[i - first]
            end = o + 4 + 2 * (w[o + 1] & 0xFFFF)
            if not disjoint(w[o + 4:end:2]):
                hits[i] = [j for j, t in enumerate(w[o + 4:end:2]) if t in wanted]
        self._proto_hits = (wanted, hits)
        return hits


def _scan(w, op: str) -> tuple[list[int], bytearray]:
    """One pass over the type section: word offset and kind of every record."""
    offs: list[int] = []
    kinds = bytearray()
    add_off, add_kind, step = offs.append, kinds.append, _STEP
    i, n = 0, len(w)
    try:
        while i < n:
            info = w[i + 1]
            k = (info >> 24) & 0x1F
            fixed, per = step[k]
            add_off(i)
            add_kind(k)
            i += fixed + (info & 0xFFFF) * per
    except TypeError:
        raise BTFError(op, f"type id {len(offs) + 1}: unknown kind {k}") from None
    except IndexError:
        raise BTFError(op, f"type id {len(offs) + 1}: truncated record") from None
    if i != n:
        raise BTFError(op, f"type id {len(offs)}: record runs past the type section")
    return offs, kinds


def _kind_code(kind: str) -> int:
    code = _KIND_BY_NAME.get(kind)
    if code is None:
        raise BTFError("find", f"unknown kind {kind!r}")
    return code


# -- types ---------------------------------------------------------------------------------------------


class Type:
    """A BTF type; referenced types are kept as ids and resolved through `btf` on access."""

    __slots__ = ("btf", "id", "name")
    kind = ""

    def __init__(self, btf: BTF, type_id: int, name: str, off: int = 0):
        self.btf = btf
        self.id = type_id
        self.name = name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} [{self.id}] {self.name or '(anon)'}>"

    @property
    def size(self) -> int:
        raise BTFError(f"size of {self.kind} [{self.id}] {self.name}", "type has no size")

    def strip(self) -> Type:
        """The type under any typedef/const/volatile/restrict/type_tag."""
        return self

    def c_decl(self, name: str = "") -> str:
        return c_decl(self, name)


class Void(Type):
    __slots__ = ()
    kind = "void"


class _Sized(Type):
    __slots__ = ("_size",)

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name)
        self._size = btf._w[off + 2]

    @property
    def size(self) -> int:
        return self._size


class Int(_Sized):
    __slots__ = ("encoding", "offset", "bits")
    kind = "int"

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name, off)
        v = btf._w[off + 3]
        self.encoding, self.offset, self.bits = (v >> 24) & 0x0F, (v >> 16) & 0xFF, v & 0xFF

    signed = property(lambda self: bool(self.encoding & INT_SIGNED))
    char = property(lambda self: bool(self.encoding & INT_CHAR))
    bool = property(lambda self: bool(self.encoding & INT_BOOL))


class Float(_Sized):
    __slots__ = ()
    kind = "float"


class _Ref(Type):
    """A type whose third word is a type id: PTR, TYPEDEF, modifiers, FUNC, VAR, DECL_TAG."""

    __slots__ = ("target_id",)

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name)
        self.target_id = btf._w[off + 2]

    @property
    def target(self) -> Type:
        return self.btf.type(self.target_id)


class Ptr(_Ref):
    __slots__ = ()
    kind = "ptr"
    size = 8


class _Modifier(_Ref):
    __slots__ = ()

    @property
    def size(self) -> int:
        return self.target.size

    def strip(self) -> Type:
        t = self.target
        while isinstance(t, _Modifier):
            t = t.target
        return t


class Typedef(_Modifier):
    __slots__ = ()
    kind = "typedef"


class Volatile(_Modifier):
    __slots__ = ()
    kind = "volatile"


class Const(_Modifier):
    __slots__ = ()
    kind = "const"


class Restrict(_Modifier):
    __slots__ = ()
    kind = "restrict"


class TypeTag(_Modifier):
    __slots__ = ()
    kind = "type_tag"


class Array(Type):
    __slots__ = ("elem_id", "index_id", "nelems")
    kind = "array"

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name)
        w = btf._w
        self.elem_id, self.index_id, self.nelems = w[off + 3], w[off + 4], w[off + 5]

    elem = property(lambda self: self.btf.type(self.elem_id))
    index = property(lambda self: self.btf.type(self.index_id))

    @property
    def size(self) -> int:
        return self.elem.size * self.nelems


class Member:
    """A struct/union member: bit_offset from the start of its parent, bitfield_size 0 unless a bitfield."""

    __slots__ = ("btf", "name", "type_id", "bit_offset", "bitfield_size")

    def __init__(self, btf: BTF, name: str, type_id: int, bit_offset: int, bitfield_size: int = 0):
        self.btf, self.name, self.type_id = btf, name, type_id
        self.bit_offset, self.bitfield_size = bit_offset, bitfield_size

    type = property(lambda self: self.btf.type(self.type_id))
    offset = property(lambda self: self.bit_offset // 8, doc="byte offset (of the containing byte for bitfields)")

    def __repr__(self) -> str:
        bits = f":{self.bitfield_size}" if self.bitfield_size else ""
        return f"<Member {self.name or '(anon)'}{bits} type={self.type_id} bit_offset={self.bit_offset}>"


class Composite(_Sized):
    """STRUCT or UNION."""

    __slots__ = ("_off", "_members")

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name, off)
        self._off = off
        self._members: list[Member] | None = None

    @property
    def members(self) -> list[Member]:
        if self._members is None:
            btf, w, o = self.btf, self.btf._w, self._off
            info = w[o + 1]
            kflag, out = info >> 31, []
            for p in range(o + 3, o + 3 + 3 * (info & 0xFFFF), 3):
                tid, bits = w[p + 1], w[p + 2]
                if kflag:
                    out.append(Member(btf, btf._str(w[p]), tid, bits & 0xFFFFFF, bits >> 24))
                    continue
                m = Member(btf, btf._str(w[p]), tid, bits)
                if tid and btf.kind_of(tid) == "int":
                    t = btf.type(tid)
                    if t.offset or t.bits != t.size * 8:  # bitfield encoded the old way, in the INT
                        m.bit_offset += t.offset
                        m.bitfield_size = t.bits
                out.append(m)
            self._members = out
        return self._members

    def member(self, name: str) -> tuple[Member, int]:
        """The member called `name` (also inside anonymous struct/union members) and its total bit offset."""
        found = self._find_member(name, 0)
        if found is None:
            raise BTFError(f"member {self.kind} {self.name or '(anon)'}.{name}", "no such member")
        return found

    def _find_member(self, name: str, base: int) -> tuple[Member, int] | None:
        for m in self.members:
            if m.name == name:
                return m, base + m.bit_offset
        for m in self.members:
            if not m.name:
                t = m.type.strip()
                if isinstance(t, Composite):
                    found = t._find_member(name, base + m.bit_offset)
                    if found is not None:
                        return found
        return None

    def member_path(self, path: str) -> tuple[Member, int]:
        """Member `a.b.c` through nested (not pointed-to) structs/unions, with its total bit offset."""
        t: Type = self
        total, m = 0, None
        for part in path.split("."):
            s = t.strip()
            if not isinstance(s, Composite):
                raise BTFError(f"member {self.kind} {self.name or '(anon)'}.{path}",
                               f"{m.name if m else path!r} is a {s.kind}, not a struct or union")
            m, off = s.member(part)
            total += off
            t = m.type
        return m, total


class Struct(Composite):
    __slots__ = ()
    kind = "struct"


class Union(Composite):
    __slots__ = ()
    kind = "union"


class _EnumBase(_Sized):
    __slots__ = ("_off", "_values")

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name, off)
        self._off = off
        self._values: dict[str, int] | None = None

    signed = property(lambda self: bool(self.btf._w[self._off + 1] >> 31))

    @property
    def values(self) -> dict[str, int]:
        """Enumerator name -> value, in declaration order."""
        if self._values is None:
            self._values = dict(self._decode())
        return self._values

    def name_of(self, value: int) -> str | None:
        """The first enumerator with this value, or None."""
        for k, v in self.values.items():
            if v == value:
                return k
        return None


class Enum(_EnumBase):
    __slots__ = ()
    kind = "enum"

    def _decode(self):
        btf, w, o = self.btf, self.btf._w, self._off
        signed = self.signed
        for p in range(o + 3, o + 3 + 2 * (w[o + 1] & 0xFFFF), 2):
            v = w[p + 1]
            yield btf._str(w[p]), (v - (1 << 32) if signed and v >> 31 else v)


class Enum64(_EnumBase):
    __slots__ = ()
    kind = "enum64"

    def _decode(self):
        btf, w, o = self.btf, self.btf._w, self._off
        signed = self.signed
        for p in range(o + 3, o + 3 + 3 * (w[o + 1] & 0xFFFF), 3):
            v = w[p + 1] | (w[p + 2] << 32)
            yield btf._str(w[p]), (v - (1 << 64) if signed and v >> 63 else v)


class Fwd(Type):
    __slots__ = ("is_union",)
    kind = "fwd"

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name)
        self.is_union = bool(btf._w[off + 1] >> 31)


class Func(_Ref):
    __slots__ = ("linkage",)
    kind = "func"

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name, off)
        self.linkage = LINKAGE.get(btf._w[off + 1] & 0xFFFF, "unknown")

    @property
    def proto(self) -> FuncProto:
        return self.target

    def c_prototype(self) -> str:
        """E.g. `int ip_send_skb(struct net *net, struct sk_buff *skb)`."""
        return c_decl(self.target, self.name)


class Param:
    __slots__ = ("btf", "name", "type_id")

    def __init__(self, btf: BTF, name: str, type_id: int):
        self.btf, self.name, self.type_id = btf, name, type_id

    type = property(lambda self: self.btf.type(self.type_id))

    def __repr__(self) -> str:
        return f"<Param {self.name or '(anon)'} type={self.type_id}>"


class FuncProto(Type):
    """Return type and parameters; a trailing unnamed void parameter (varargs) sets `variadic` instead."""

    __slots__ = ("ret_id", "_off", "_params", "variadic")
    kind = "func_proto"

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name)
        self.ret_id = btf._w[off + 2]
        self._off = off
        self._params: list[Param] | None = None
        self.variadic = False

    ret = property(lambda self: self.btf.type(self.ret_id))

    @property
    def params(self) -> list[Param]:
        if self._params is None:
            btf, w, o = self.btf, self.btf._w, self._off
            out = [Param(btf, btf._str(w[p]), w[p + 1]) for p in range(o + 3, o + 3 + 2 * (w[o + 1] & 0xFFFF), 2)]
            if out and out[-1].type_id == 0 and not out[-1].name:
                out.pop()
                self.variadic = True
            self._params = out
        return self._params


class Var(_Ref):
    __slots__ = ("linkage",)
    kind = "var"

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name, off)
        self.linkage = LINKAGE.get(btf._w[off + 3], "unknown")

    @property
    def size(self) -> int:
        return self.target.size


class VarSecinfo:
    __slots__ = ("btf", "type_id", "offset", "size")

    def __init__(self, btf: BTF, type_id: int, offset: int, size: int):
        self.btf, self.type_id, self.offset, self.size = btf, type_id, offset, size

    type = property(lambda self: self.btf.type(self.type_id))


class Datasec(_Sized):
    __slots__ = ("vars",)
    kind = "datasec"

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name, off)
        w = btf._w
        self.vars = [VarSecinfo(btf, w[p], w[p + 1], w[p + 2])
                     for p in range(off + 3, off + 3 + 3 * (w[off + 1] & 0xFFFF), 3)]


class DeclTag(_Ref):
    __slots__ = ("component_idx",)
    kind = "decl_tag"

    def __init__(self, btf, type_id, name, off):
        super().__init__(btf, type_id, name, off)
        v = btf._w[off + 3]
        self.component_idx = v - (1 << 32) if v >> 31 else v  # -1: the type itself


_CLASSES: list = [None] * 32
for _cls in (Int, Ptr, Array, Struct, Union, Enum, Fwd, Typedef, Volatile, Const, Restrict, Func, FuncProto,
             Var, Datasec, Float, DeclTag, TypeTag, Enum64):
    _CLASSES[_KIND_BY_NAME[_cls.kind]] = _cls


# -- C declarations (the rules of libbpf's btf_dump, as `bpftool btf dump format c` writes them) ----------


def c_decl(t: Type, name: str = "") -> str:
    """C declaration of `name` with type `t`, e.g. `struct sk_buff *skb`, `int (*fn)(int)`, `char s[16]`."""
    if isinstance(t, Func):
        return c_decl(t.target, name or t.name)
    if isinstance(t, Var):
        return c_decl(t.target, name or t.name)
    stack: list[Type] = []
    while True:
        stack.append(t)
        if isinstance(t, Array):
            t = t.elem
        elif isinstance(t, FuncProto):
            t = t.ret
        elif isinstance(t, (Ptr, Volatile, Const, Restrict, TypeTag)):
            t = t.target
        else:
            break
    out: list[str] = []
    _chain(stack, name, out)
    return "".join(out)


_QUALS = {"volatile": "volatile", "const": "const", "restrict": "restrict"}


def _mods(stack: list[Type], out: list[str]) -> None:
    while stack and stack[-1].kind in _QUALS:
        out.append(stack.pop().kind + " ")


def _drop_mods(stack: list[Type]) -> None:
    while stack and stack[-1].kind in _QUALS:
        stack.pop()


def _name(name: str, last_was_ptr: bool, out: list[str]) -> None:
    out.append(" " + name if name and not last_was_ptr else name)


def _chain(stack: list[Type], fname: str, out: list[str]) -> None:
    last_was_ptr = True
    while stack:
        t = stack.pop()
        kind = t.kind
        if kind in ("void", "int", "float", "typedef"):
            _mods(stack, out)
            out.append(t.name or kind)
        elif kind in ("struct", "union", "enum", "enum64"):
            _mods(stack, out)
            word = "enum" if kind == "enum64" else kind
            out.append(f"{word} {t.name}" if t.name else word + " {...}")
        elif kind == "fwd":
            _mods(stack, out)
            out.append(("union " if t.is_union else "struct ") + t.name)
        elif kind == "ptr":
            out.append("*" if last_was_ptr else " *")
        elif kind in _QUALS:
            out.append(" " + kind)
        elif kind == "type_tag":
            _mods(stack, out)
            out.append(f' __attribute__((btf_type_tag("{t.name}")))')
        elif kind == "array":
            _drop_mods(stack)
            if not stack:
                _name(fname, last_was_ptr, out)
                out.append(f"[{t.nelems}]")
                return
            multidim = stack[-1].kind == "array"
            if fname and not last_was_ptr:
                out.append(" ")
            if not multidim:
                out.append("(")
            _chain(stack, fname, out)
            if not multidim:
                out.append(")")
            out.append(f"[{t.nelems}]")
            return
        elif kind == "func_proto":
            _drop_mods(stack)
            if stack:
                out.append(" (")
                _chain(stack, fname, out)
                out.append(")")
            else:
                _name(fname, last_was_ptr, out)
            params = t.params
            if not params:
                out.append("(void)")
                return
            decls = [c_decl(p.type, p.name) for p in params]
            if t.variadic:
                decls.append("...")
            out.append("(" + ", ".join(decls) + ")")
            return
        else:
            raise BTFError(f"declare {fname or '(anon)'}", f"unexpected {kind} [{t.id}] in a declarator")
        last_was_ptr = kind == "ptr"
    _name(fname, last_was_ptr, out)
