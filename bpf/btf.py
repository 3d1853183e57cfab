"""BTF reader: a lazy index over a .BTF blob (vmlinux or split module BTF): ids, names, and scans over them."""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Iterator
from enum import IntEnum
from itertools import accumulate, compress

from .btf_types import (INT_BOOL, INT_CHAR, INT_SIGNED, LINKAGE, Array, Composite, Const, Datasec, DeclTag,
                        Enum, Enum64, Float, Func, FuncProto, Fwd, Int, Member, Param, Ptr, Restrict, Struct, Type,
                        Typedef, TypeTag, Union, Var, VarSecinfo, Void, Volatile)
from .cdecl import c_decl
from .errors import BTFError

# The reader's own names, then those of bpf.btf_types, bpf.cdecl and BTFError: `from bpf.btf import ...` finds
# them all here.
__all__ = ["BTF", "KIND_NAMES", "SYSFS_BTF", "Kind", "BTFError", "c_decl",
           "INT_BOOL", "INT_CHAR", "INT_SIGNED", "LINKAGE", "Array", "Composite", "Const", "Datasec", "DeclTag", "Enum",
           "Enum64", "Float", "Func", "FuncProto", "Fwd", "Int", "Member", "Param", "Ptr", "Restrict", "Struct", "Type",
           "Typedef", "TypeTag", "Union", "Var", "VarSecinfo", "Void", "Volatile"]

SYSFS_BTF = "/sys/kernel/btf"
MEMO_NAMES = 128   # names of vmlinux remembered per boot: a start's few (past them, a run of many builds its index)

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
_CLASSES: list = [None] * 32  # the class of each kind code (BTF.type builds its objects with them)
for _cls in (Int, Ptr, Array, Struct, Union, Enum, Fwd, Typedef, Volatile, Const, Restrict, Func, FuncProto,
             Var, Datasec, Float, DeclTag, TypeTag, Enum64):
    _CLASSES[_KIND_CODES[_cls.kind]] = _cls


class BTF:
    """The types of one BTF blob; a split BTF (kernel module) continues the ids and strings of its base."""

    _vmlinux: BTF | None = None
    _modules: dict[str, BTF] = {}

    def __init__(self, name: str, base: BTF | None, words, strs: bytes, offs: list[int], kinds: bytearray):
        self.name, self.base = name, base
        self.words = words       # the type section as u32 words (the types read their records from it)
        self._strs = strs        # this blob's own string section
        self._offs = offs        # word offset of each own type record, indexed by id - _first
        self._kinds = kinds      # kind of each own type, indexed by id - _first
        self._first = len(base) if base is not None else 1
        self._str_first = base._str_first + len(base._strs) if base is not None else 0
        self._cache: dict[int, Type] = {}
        self._str_cache: dict[int, str] = {}
        self._str_found: dict[bytes, list[int]] = {}
        self._names: dict[tuple[str, int | None], list[int]] = {}
        self._name_offs: array | None = None
        self._name_list: list[int] | None = None  # _name_offs as a list, searched with list.index
        self._memo: dict[str, list[int]] | None = None   # vmlinux: names looked up in earlier runs this boot
        self._memo_key = b""
        self._data = b""                          # the blob (the vmlinux BTF's goes into bpf.btf_cache)
        self._name_index: dict[bytes, list[int]] | None = None
        self._lookups = 0
        self._by_kind: dict[tuple, list[int]] = {}
        self._refs: tuple[list[int], list[int], dict[int, list[tuple[int, int]]]] | None = None
        self._func_targets: list[int] | None = None
        self._proto_hits: tuple[frozenset, dict[int, list[int]]] = (frozenset(), {})
        self.decl_cache: dict[int, tuple[str, bool] | None] = {}

    @property
    def root(self) -> BTF:
        """The blob the kernel's own types are in: the base of a split BTF (a module's), else this one."""
        return self if self.base is None else self.base

    @classmethod
    def load(cls, data: bytes, base: BTF | None = None, name: str = "", index: tuple | None = None) -> BTF:
        """Parse a raw .BTF blob; `base` for split BTF. Only record offsets are computed here, or taken from
        `index` (offsets, kinds, name offsets: bpf.btf_cache) when it fits the blob."""
        op = f"parse {name or 'BTF'}"
        data = data if isinstance(data, memoryview) and data.readonly else bytes(data)   # (a mapped cache: no copy)
        if len(data) < 24:
            raise BTFError(op, f"truncated header ({len(data)} bytes)")
        endian = {b"\x9f\xeb": "<", b"\xeb\x9f": ">"}.get(bytes(data[:2]))
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
        strs = bytes(data[hdr_len + str_off:hdr_len + str_off + str_len])
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
        if index is not None and _fits(index, words):
            btf = cls(name, base, words, strs, index[0], index[1])
            btf._name_offs = index[2]
        else:
            btf = cls(name, base, words, strs, *_scan(words, op, first))
        btf._data = data
        return btf

    @classmethod
    def load_file(cls, path: str, base: BTF | None = None, name: str = "", index: tuple | None = None) -> BTF:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise BTFError(f"read {path}", e.strerror or e, e.errno) from e
        return cls.load(data, base, name or os.path.basename(path), index)

    @classmethod
    def vmlinux(cls) -> BTF:
        """The kernel's BTF, /sys/kernel/btf/vmlinux, loaded once per process; the blob and its index cached per
        boot (bpf.btf_cache)."""
        if BTF._vmlinux is None:
            from . import btf_cache
            path = os.path.join(SYSFS_BTF, "vmlinux")
            try:
                ident = btf_cache.key(path)
            except OSError:
                ident = None
            cached = btf_cache.load("vmlinux", ident) if ident else None
            btf = cls.load(cached[0], name="vmlinux", index=cached[1:]) if cached is not None else None
            if btf is None or btf._offs is not cached[1]:
                btf = cls.load_file(path, name="vmlinux")
                if ident:
                    btf_cache.store("vmlinux", ident, btf._data, btf._offs, btf._kinds, btf._record_names())
            if ident:
                btf._remember_names(ident)
            BTF._vmlinux = btf
        return BTF._vmlinux

    @classmethod
    def module(cls, name: str) -> BTF:
        """A kernel module's split BTF, /sys/kernel/btf/<name> on top of vmlinux, loaded once per process."""
        if not name or "/" in name or name in (".", "..", "vmlinux"):
            raise BTFError(f"load module BTF {name!r}", "not a module name")
        if name not in BTF._modules:
            BTF._modules[name] = cls.load_file(os.path.join(SYSFS_BTF, name), cls.vmlinux(), name)
        return BTF._modules[name]

    @classmethod
    def files(cls) -> list[str]:
        """The paths of the kernel's BTF files (vmlinux, then each module's): what a cache of anything made from
        them is keyed by."""
        return [os.path.join(SYSFS_BTF, n) for n in ("vmlinux", *cls.module_names())]

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
                t = _CLASSES[self._kinds[i]](self, type_id, self.string(self.words[o]), o)
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

    def string(self, off: int) -> str:
        """The string at `off` in this chain's string space (a split BTF's lower offsets are its base's)."""
        s = self._str_cache.get(off)
        if s is None:
            if off < self._str_first:
                return self.base.string(off)
            o = off - self._str_first
            end = self._strs.find(b"\0", o)
            if end < 0:
                raise BTFError(f"string {self.name or 'BTF'}", f"offset {off} out of range")
            s = self._str_cache[off] = self._strs[o:end].decode("utf-8", "replace")
        return s

    def _str_offsets(self, prefix: bytes, whole: bool) -> list[int]:
        """Offsets, in this chain's string space, of the strings equal to (or starting with) `prefix`."""
        out = [] if self.base is None else self.base._str_offsets(prefix, whole)
        # (searched without a leading NUL, checked after: bytes.find is some ten times slower on a pattern that
        # starts with the section's most common byte; a split section need not begin with NUL)
        pat, strs, pos = prefix + (b"\0" if whole else b""), self._strs, -1
        found = self._str_found.get(pat)
        if found is None:
            found = []
            while True:
                pos = strs.find(pat, pos + 1)
                if pos < 0:
                    break
                if pos == 0 or strs[pos - 1] == 0:
                    found.append(self._str_first + pos)
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

    def _record_names(self) -> array:
        """The name offset of each own type record, in id order."""
        if self._name_offs is None:
            w = self.words
            self._name_offs = array("I", [w[o] for o in self._offs])
        return self._name_offs

    def _ids_named(self, name: str) -> list[int]:
        """Own ids named `name`: remembered per boot for vmlinux (bpf.btf_cache: a start looks up the same few
        names every time: up to MEMO_NAMES, since the file is written again for each), else found by _scan_named."""
        memo = self._memo
        if memo is None:
            return self._scan_named(name)
        ids = memo.get(name)
        if ids is None:
            ids = self._scan_named(name)
            if len(memo) >= MEMO_NAMES:
                return ids
            memo[name] = ids
            from . import btf_cache
            btf_cache.write("vmlinux-names", self._memo_key, "".join(
                f"{n}\t{' '.join(map(str, i))}\n" for n, i in memo.items()).encode())
        return ids

    def _remember_names(self, ident: bytes) -> None:
        """Keep the names looked up in this BTF (and their ids) per boot under the key `ident`."""
        from . import btf_cache
        data = btf_cache.read("vmlinux-names", ident)
        memo: dict[str, list[int]] = {}
        for line in bytes(data).decode(errors="replace").splitlines() if data is not None else ():
            n, _, ids = line.partition("\t")
            memo[n] = [int(i) for i in ids.split()]
        self._memo, self._memo_key = memo, ident

    def _scan_named(self, name: str) -> list[int]:
        """Own ids named `name`: a few lookups scan (at C speed); after many, a full index pays off."""
        if self._name_index is None:
            self._record_names()
            self._lookups += 1
            if self._lookups <= 32:
                offs = self._str_offsets(name.encode(), True)
                if self._name_list is None:   # (list.index: ~1 ms over 130,000 names, array.index ~5)
                    self._name_list = self._name_offs.tolist()
                return sorted(i for off in offs for i in _positions(self._name_list, off, self._first))
            by_off: dict[int, list[int]] = {}
            for i, off in enumerate(self._name_offs, self._first):
                by_off.setdefault(off, []).append(i)
            parts = self._strs.split(b"\0")
            strings = dict(zip(accumulate([len(p) + 1 for p in parts], initial=self._str_first), parts))
            self._name_index = {strings[off] if off in strings else self.string(off).encode(): ids
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
            w = self.words
            self._func_targets = [w[o + 2] for o in compress(self._offs, self._selector((Kind.FUNC,)))]
        ids = compress(self._ids_of(Kind.FUNC), map(hits.__contains__, self._func_targets))
        return [(f, hits[f.target_id]) for f in map(self.type, ids)]

    def typedefs_to_func_proto(self, prefix: str) -> list[tuple[str, FuncProto]]:
        """Own typedefs named `prefix...` that are pointers to a FUNC_PROTO (e.g. prefix "btf_trace_")."""
        names = set(self._str_offsets(prefix.encode(), False))
        w, offs, first, out = self.words, self._offs, self._first, []
        for i in self._ids_of(Kind.TYPEDEF) if names else ():
            o = offs[i - first]
            if w[o] in names:
                ptr = self.type(w[o + 2]).strip()
                proto = ptr.target.strip() if isinstance(ptr, Ptr) else None
                if isinstance(proto, FuncProto):
                    out.append((self.string(w[o]), proto))
        return out

    def _rev(self, type_id: int) -> list[tuple[int, int]]:
        """(id, kind) of the PTR and modifier types, in this chain, whose target is `type_id`."""
        out: list[tuple[int, int]] = []
        btf: BTF | None = self
        while btf is not None:
            if btf._refs is None:
                sel, w = btf._selector(_REFS), btf.words
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
            w, offs, first, disjoint, hits = self.words, self._offs, self._first, wanted.isdisjoint, {}
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


def _fits(index: tuple, w) -> bool:
    """Whether an index (offsets, kinds, name offsets) can be this type section's: as many entries of each, and
    its last record ending where the section ends."""
    offs, kinds, names = index
    if not len(offs) == len(kinds) == len(names) > 0 or offs[-1] + 1 >= len(w):
        return False
    step = _STEP[kinds[-1]] if kinds[-1] < len(_STEP) else None
    return step is not None and offs[-1] + step[0] + (w[offs[-1] + 1] & 0xFFFF) * step[1] == len(w)


def _kind_code(kind: str) -> int:
    if kind not in _KIND_CODES:
        raise BTFError("find", f"unknown kind {kind!r}; kinds are {', '.join(_KIND_CODES)}")
    return _KIND_CODES[kind]
