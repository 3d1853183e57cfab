"""--dump PATH: what the kernel held for each packet (an argument, a member chain, `return` at fexit), copied by the
capture program into the record's dump area (fcap.kernel.layout's DUMP) and shown in user space from BTF
(bpf.btf_dump); in pcapng each dump travels with its packet as a comment (the text) and a custom option (the
bytes), which fcap's reader turns back into Dumps."""

from __future__ import annotations

import collections
import errno as errno_mod
import functools
import os
import struct
from dataclasses import dataclass, field

from bpf.asm import (AND, DW, FP, JEQ, JNE, MUL, R0, R1, R2, R3, R7, R8, R9, XOR, addi, alu64, call, ja, jmp, label,
                     ld_imm64, ldx, lshi, mov, movi, rshi, stx)
from bpf.btf import BTF, BTFError, Composite, Ptr, Type
from bpf.btf_dump import decode, dump_type_data, format_node, type_name
from bpf.uapi import Helper

from fcap.errors import PathError
from fcap.kernel.parts import BEFORE_COPY, Part
from fcap.kernel.layout import (DUMP, DUMP_MAX, DUMP_NULL, DUMP_OK, DUMP_OPTS_MAX, DUMP_TEXT, DUMP_TEXT_KEY,
                                DUMPS_MAX, META, META_SIZE, STACK, parse_record)
from fcap.points.members import PATH, parse_path, root, walk
from fcap.points.spec import Point

FLAG = "--dump"
# pcapng: a custom option (RFC 5612's example Private Enterprise Number, until fcap has its own) per dump
PEN = 32473
OPT_CUSTOM_BINARY = 2989     # custom option, binary, may be copied
_OPT = struct.Struct("<BiHBBQI")   # version, status, null_at, bit offset, bits, addr, type size; then names, data
OPT_VERSION = 1


@dataclass
class DumpPlan:
    """How one --dump PATH is read at one point."""

    path: str
    arg_index: int
    chain: list[int]          # offsets of the pointers loaded on the way (the argument's value is the first base)
    off: int                  # where the bytes start in the last object
    size: int                 # bytes copied (at most DUMP_MAX)
    type: Type                # what the bytes hold
    value: bool = False       # the bytes are the argument's value itself (nothing is read)
    bit_offset: int = 0       # a bitfield: its bits within the bytes copied
    bits: int = 0
    mask: int = 0             # ANDed into the last pointer loaded (--ct: skb->_nfct's low bits are ctinfo)

    @property
    def ctype(self) -> str:
        return type_name(self.type)


CT_PATH = "ct"            # --ct: the skb's conntrack entry, a dump of its own
NFCT_PTRMASK = -8         # skb->_nfct & ~7: the struct nf_conn (the low bits: enum ip_conntrack_info)


CT_MODULE = "nf_conntrack"   # where struct nf_conn is when conntrack is a module


def ct_plan(point: Point) -> DumpPlan:
    """--ct: the struct nf_conn at skb->_nfct & ~7 (state, zone, mark, original and reply tuples: NAT shows), typed
    from vmlinux's BTF or, where conntrack is a module, from the loaded module's."""
    vm = point.btf.root
    skb = vm.find("sk_buff", "struct")
    try:
        off = skb.member("_nfct")[1] // 8
    except BTFError:
        raise PathError("--ct: this kernel's sk_buff has no _nfct (built without conntrack)") from None
    conn = vm.find("nf_conn", "struct")
    if conn is None and CT_MODULE in BTF.module_names():
        conn = BTF.module(CT_MODULE).find("nf_conn", "struct")
    if conn is None and os.path.isdir(f"/sys/module/{CT_MODULE}"):
        raise PathError(f"--ct: {CT_MODULE} is a module without BTF here (module BTF came in 5.11): this kernel "
                        f"cannot type struct nf_conn")
    if conn is None:
        raise PathError(f"--ct: struct nf_conn is in neither vmlinux's BTF nor a loaded module's ({CT_MODULE} is not "
                        f"loaded: no conntrack or NAT rule yet; modprobe {CT_MODULE})")
    return DumpPlan(CT_PATH, point.skb_index, [off], 0, min(conn.size, DUMP_MAX), conn, mask=NFCT_PTRMASK)


def plan(point: Point, path: str) -> DumpPlan:
    """Resolve PATH at the point (PathError with one line when it does not resolve)."""
    if path == CT_PATH:
        return ct_plan(point)
    if not PATH.match(path):
        raise PathError(f"{FLAG} {path!r}: expected an argument or a member chain, e.g. skb, 'skb->dev', "
                        f"'skb->sk->__sk_common', return")
    steps = parse_path(path)
    arg_index, t = root(point, path, steps[0].name, FLAG)
    chain, off, bits_at, t = walk(path, steps, t, FLAG)
    path = "".join(("->" if s.deref else ".") + s.name for s in steps[1:])
    path = steps[0].name + path
    leaf = t.strip()
    target = leaf.target.strip() if isinstance(leaf, Ptr) else None
    is_arg = len(steps) == 1
    if isinstance(target, Composite) and target.size:   # a pointer to a struct/union: what it points to
        if not is_arg:
            chain = chain + [off]
        return DumpPlan(path, arg_index, chain, 0, min(target.size, DUMP_MAX), leaf.target)
    if is_arg:
        if isinstance(leaf, Composite):
            raise PathError(f"{FLAG} {path}: a struct passed by value cannot be dumped")
        return DumpPlan(path, arg_index, [], 0, min(_size(leaf), 8), t, value=True)
    if bits_at is not None:
        bit_off, nbits = bits_at
        return DumpPlan(path, arg_index, chain, bit_off // 8, (bit_off % 8 + nbits + 7) // 8, t,
                    bit_offset=bit_off % 8, bits=nbits)
    size = _size(leaf)
    if size == 0:
        raise PathError(f"{FLAG} {path}: {type_name(t)} has no size to dump")
    return DumpPlan(path, arg_index, chain, off, min(size, DUMP_MAX), t)


def _size(t: Type) -> int:
    try:
        return t.size
    except BTFError:
        return 0


def _slot_bytes(size: int) -> int:
    return DUMP.size + (size + 7 & ~7)


class Area:
    """The dump area of a capture: one slot per PATH, as large as the largest of the points' plans for it."""

    def __init__(self, paths: list[str], plans: dict[int, list[DumpPlan]]):
        self.paths = paths
        self.plans = plans        # point id -> a DumpPlan per path
        self.slots: list[int] = []
        at = 0
        for i, path in enumerate(paths):
            self.slots.append(at)
            at += _slot_bytes(max(p[i].size for p in plans.values()))
        self.size = at
        if self.size > DUMPS_MAX:
            raise PathError(f"{FLAG}: the dumps take {self.size} bytes per packet; at most {DUMPS_MAX} fit "
                            f"(dump members rather than whole structures)")

    def for_point(self, point: Point) -> PointDumps:
        return PointDumps(self, self.plans[point.id])

    def parse(self, raw):
        """The Record (with its dumps) of a perf sample that starts with this area."""
        rec = parse_record(memoryview(raw)[self.size:])
        return rec._replace(dumps=self.dumps(raw, rec.point))

    def dumps(self, raw, point: int) -> tuple:
        plans = self.plans.get(point)
        if plans is None:
            return ()
        out = []
        for at, p in zip(self.slots, plans):
            h = DUMP.unpack(raw, at)
            size = min(h.size, p.size)
            out.append(Dump(p.path, p.type, p.ctype, h.addr, bytes(raw[at + DUMP.size:at + DUMP.size + size]),
                            h.status, h.null_at, p.bit_offset, p.bits))
        return tuple(out)


def fit_rings(points: list[Point], paths: list[str]) -> bool:
    """Whether the options of these dumps at these points likely fit what the programs copy (layout.DUMP_OPTS_MAX):
    their length with every byte 0xff (every field set, the largest numbers), which user space makes for each
    record anyway. A dump's options that do not fit take the perf buffer every time, with the records of its
    packets: a flood of those is faster on the perf buffer's own path."""
    from fcap.files.pcapfile import further_options
    area = make_area(points, paths)
    for plans in area.plans.values():
        full = tuple(Dump(p.path, p.type, p.ctype, (1 << 64) - 1, b"\xff" * p.size, DUMP_OK, 0, p.bit_offset,
                          p.bits) for p in plans)
        if len(further_options(*records_options(full))) > DUMP_OPTS_MAX:
            return False
    return True


def make_area(points: list[Point], paths: list[str]) -> Area | None:
    if not paths:
        return None
    return Area(list(paths), {p.id: [plan(p, path) for path in paths] for p in points})


@dataclass
class PointDumps:
    """What one point's program writes: Builder.build calls emit() after the metadata."""

    area: Area
    plans: list[DumpPlan]

    @property
    def size(self) -> int:
        return self.area.size

    def emit(self, b) -> None:
        for at, p in zip(self.area.slots, self.plans):
            _emit_one(b, p, at - self.area.size)
        if b.maps.dumptext:
            self._key(b)

    def _key(self, b) -> None:
        """META's dumps: a hash of what the slots hold (each header, then the bytes it says were read, the last word
        cut to them), seeded with this process's SEED and the point's id (its plans name the types); never 0. Uses
        R0-R3."""
        b.emit(ld_imm64(R1, SEED ^ b.point.id), ld_imm64(R2, MIX))
        for at, p in zip(self.area.slots, self.plans):
            base, skip = at - self.area.size, b.fresh("dump_hashed")
            b.emit(_mix(base), _mix(base + 8), DUMP.load(R0, R7, "status", base), jmp(JNE, R0, DUMP_OK, skip))
            for j in range(0, p.size, 8):
                b.emit(_mix(base + DUMP.size + j, min(8, p.size - j)))
            b.emit(label(skip))
        for mul in (FMIX1, FMIX2, None):
            b.emit(mov(R3, R1), rshi(R3, 33), alu64(XOR, R1, R3, reg=True))
            if mul is not None:
                b.emit(ld_imm64(R3, mul), alu64(MUL, R1, R3, reg=True))
        keyed = b.fresh("dump_keyed")
        b.emit(jmp(JNE, R1, 0, keyed), movi(R1, 1), label(keyed), META.store(R7, "dumps", R1))


# the dumps' hash: per word h = ((h ^ w) * MIX), h ^= h >> 32; MurmurHash3's fmix64 at the end. Each step can be
# undone, so the seed is random, this process's: no one who sets bytes a dump holds (a socket's ports) can aim at
# another dump's hash, whose options would be copied into his packets' records.
SEED, MIX = int.from_bytes(os.urandom(8), "little"), 0x9E3779B97F4A7C15
FMIX1, FMIX2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53


def _mix(at: int, n: int = 8) -> list:
    """R1 = the hash after the word at R7 + at, its first n bytes (R2: MIX; R0, R3 scratch)."""
    cut = [lshi(R0, 64 - 8 * n), rshi(R0, 64 - 8 * n)] if n < 8 else []
    return [ldx(DW, R0, R7, at), *cut, alu64(XOR, R1, R0, reg=True), alu64(MUL, R1, R2, reg=True), mov(R3, R1),
            rshi(R3, 32), alu64(XOR, R1, R3, reg=True)]


def emit(b) -> None:
    """The point's dumps into the area before META."""
    b.options.dumps.emit(b)


DUMPS = Part("dumps", on=lambda point, options, maps: options.dumps is not None, stages={BEFORE_COPY: emit},
             layouts=("DUMP",), fields=("dumps",), reads="fcap.kernel.dumps.Area.parse")


def _emit_one(b, p: DumpPlan, at: int) -> None:
    """One slot at R7 + at (R7 is META, past the area). Uses R0-R3, R8, R9."""
    done, null, fail = b.fresh("dump_done"), b.fresh("dump_null"), b.fresh("dump_fail")
    ctx_off = b.point.kind.arg_offset(p.arg_index)
    data = at + DUMP.size
    b.emit(ldx(DW, R9, FP, STACK.ctx), ldx(DW, R9, R9, ctx_off))
    if p.value:
        b.emit(stx(DW, R7, data, R9), DUMP.store_imm(R7, "addr", 0, at), DUMP.store_imm(R7, "status", DUMP_OK, at),
               DUMP.store_imm(R7, "size", p.size, at), DUMP.store_imm(R7, "null_at", 0, at))
        return
    b.emit(DUMP.store_imm(R7, "size", 0, at), DUMP.store_imm(R7, "null_at", 0, at),
           DUMP.store_imm(R7, "addr", 0, at))
    for k, off in enumerate(p.chain):
        b.emit(movi(R8, k), jmp(JEQ, R9, 0, null),
               mov(R1, FP), addi(R1, STACK.tmp), movi(R2, 8), mov(R3, R9), addi(R3, off),
               call(Helper.probe_read_kernel), jmp(JNE, R0, 0, fail), ldx(DW, R9, FP, STACK.tmp))
    b.emit([alu64(AND, R9, p.mask)] if p.mask else [],
           movi(R8, len(p.chain)), jmp(JEQ, R9, 0, null), [addi(R9, p.off)] if p.off else [],
           DUMP.store(R7, "addr", R9, at),
           mov(R1, R7), addi(R1, data), movi(R2, p.size), mov(R3, R9), call(Helper.probe_read_kernel),
           jmp(JNE, R0, 0, fail), DUMP.store_imm(R7, "size", p.size, at),
           DUMP.store_imm(R7, "status", DUMP_OK, at), ja(done),
           label(null), DUMP.store_imm(R7, "status", DUMP_NULL, at), DUMP.store(R7, "null_at", R8, at), ja(done),
           label(fail), DUMP.store(R7, "status", R0, at),
           label(done))


@dataclass
class Dump:
    """One --dump PATH of one packet: the bytes the program copied and the BTF type that shows them."""

    path: str
    type: Type | None         # None when read from a file whose type this kernel's BTF does not have
    ctype: str                # the type's C name: `struct net_device`, `unsigned int`
    addr: int                 # where the bytes were read (0: an argument's value)
    data: bytes
    status: int = DUMP_OK     # DUMP_OK, DUMP_NULL, or the read's -errno
    null_at: int = 0
    bit_offset: int = 0
    bits: int = 0
    comment: str = field(default="", repr=False)   # the text a file carried (when type is None)

    @property
    def error(self) -> str | None:
        """Why there are no bytes (a NULL pointer on the way, a failed read), or None."""
        if self.status == DUMP_OK:
            return None
        if self.status == DUMP_NULL:
            steps = parse_path(self.path)
            return f"NULL pointer at {_prefix(steps, self.null_at)}"
        code = -self.status
        return f"read failed: {errno_mod.errorcode.get(code, str(code))} ({os.strerror(code)})"

    def node(self):
        """The decoded value (bpf.btf_dump.Node): node['mtu'].value, node.python()."""
        if self.type is None or self.error is not None:
            return None
        return decode(self.type, self.data, self.bit_offset, self.bits)

    @property
    def value(self):
        """The value as Python data (dicts, lists, ints, strings), or None."""
        n = self.node()
        return None if n is None else n.python()

    def text(self, compact: bool = False, zeroes: bool = False) -> str:
        """`(struct net_device){ .name = (char[16])"lo", ... }` (multi-line unless compact), or the error."""
        err = self.error
        if err is not None:
            return f"<{err}>"
        if self.type is None:
            return self.comment or f"({self.ctype}) <{len(self.data)} bytes; type not in this kernel's BTF>"
        return _text(self.type, self.data, compact, zeroes, self.bit_offset, self.bits)

    def line(self, compact: bool = False, zeroes: bool = False) -> str:
        """`PATH = TEXT`, the address first where the bytes were read through a pointer."""
        at = f" @0x{self.addr:x}" if self.addr else ""
        return f"{self.path}{at} = {self.text(compact, zeroes)}"


@functools.lru_cache(maxsize=1024)
def _text(t: Type, data: bytes, compact: bool, zeroes: bool, bit_offset: int, bits: int) -> str:
    """The text of a value, remembered: packet after packet, a dump often holds the same bytes (a device)."""
    if bits:
        return format_node(decode(t, data, bit_offset, bits), compact, zeroes)
    return dump_type_data(t, data, compact, zeroes)


def _prefix(steps, n: int) -> str:
    """The path up to (and including) the n-th pointer it loads: the one that was NULL."""
    out, loaded = steps[0].name, 0
    for s in steps[1:]:
        if s.deref:
            if loaded == n:
                return out
            loaded += 1
        out += ("->" if s.deref else ".") + s.name
    return out


# ---- pcapng: a comment with the text, a custom option with the bytes -----------------------------------------

COMMENT_PREFIX = "dump "


def comment(d: Dump) -> str:
    return COMMENT_PREFIX + d.line(compact=True)


def records_options(dumps: tuple) -> tuple[list[str], list[tuple[int, bytes]]]:
    """A packet's dumps as pcapng options: (comments, [(custom option code, value)])."""
    return [comment(d) for d in dumps], [(OPT_CUSTOM_BINARY, option_value(d)) for d in dumps]


class GivenOptions:
    """--dump into the file rings: user space's half. The options of a record's dumps (records_options', laid out as
    the writer lays them out), given to the programs under the record's hash of them (META's dumps) when a record of
    that hash first comes through the perf buffer; they copy them into the records of the same hash after it
    (fcap.kernel.ringrec). The `most` given last stay in `texts`, their map: older ones are deleted (a map without
    preallocation: a value a program is copying is freed only after it), and given again when they come back."""

    def __init__(self, texts, most: int):
        self.texts, self.most = texts, most
        self._given: collections.OrderedDict = collections.OrderedDict()

    def give(self, key: int, comments: list, more: list) -> None:
        from fcap.files.pcapfile import further_options
        from fcap.kernel.ringrec import give
        if not key or key in self._given:
            return
        self._given[key] = None
        if len(self._given) > self.most:
            old, _ = self._given.popitem(last=False)
            try:
                self.texts.delete(DUMP_TEXT_KEY.struct.pack(old))
            except OSError:
                pass   # (never given: too long, or the map was full)
        give(self.texts, DUMP_TEXT_KEY.struct.pack(key), DUMP_TEXT, further_options(comments, more))


def option_value(d: Dump) -> bytes:
    """The custom option's value: PEN, then the dump (read back by from_option)."""
    path, ctype = d.path.encode(), d.ctype.encode()
    size = _size(d.type) if d.type is not None else 0
    return (struct.pack("<I", PEN) + _OPT.pack(OPT_VERSION, d.status, d.null_at, d.bit_offset, d.bits, d.addr, size)
            + struct.pack("<HH", len(path), len(ctype)) + path + ctype + d.data)


def from_option(value: bytes, btf: BTF | None = None) -> Dump | None:
    """The Dump in a custom option's value, or None when it is not fcap's. The type is looked up by name in
    `btf` (this kernel's by default) and used when its size is the one recorded."""
    if len(value) < 4 + _OPT.size + 4 or struct.unpack_from("<I", value)[0] != PEN:
        return None
    version, status, null_at, bit_offset, bits, addr, size = _OPT.unpack_from(value, 4)
    if version != OPT_VERSION:
        return None
    at = 4 + _OPT.size
    plen, clen = struct.unpack_from("<HH", value, at)
    at += 4
    path = value[at:at + plen].decode("utf-8", "replace")
    ctype = value[at + plen:at + plen + clen].decode("utf-8", "replace")
    data = bytes(value[at + plen + clen:])
    return Dump(path, _find_type(ctype, size, btf), ctype, addr, data, status, null_at, bit_offset, bits)


def _find_type(ctype: str, size: int, btf: BTF | None) -> Type | None:
    """A named type (`struct net_device`, `unsigned int`, `__be16`) of this size, or None; by default this kernel's,
    in vmlinux's BTF or else a loaded module's (struct nf_conn where conntrack is a module)."""
    if btf is not None:
        return _find_in(btf, ctype, size)
    try:
        found = _find_in(BTF.vmlinux(), ctype, size)
        for name in [] if found is not None else BTF.module_names():
            found = _find_in(BTF.module(name), ctype, size)
            if found is not None:
                break
        return found
    except BTFError:
        return None


def _find_in(btf: BTF, ctype: str, size: int) -> Type | None:
    word, _, name = ctype.partition(" ")
    kinds = {"struct": "struct", "union": "union", "enum": None}
    if word in kinds and name and "*" not in name and "[" not in name:
        candidates = [t for t in btf.find_all(name, kinds[word]) if word != "enum" or t.kind in ("enum", "enum64")]
    elif "*" in ctype or "[" in ctype or "(" in ctype:
        return None
    else:
        candidates = btf.find_all(ctype)
    for t in candidates:
        if _size(t) == size and t.kind not in ("func", "var"):
            return t
    return None


def dumps_of(custom: tuple, comments: list[str]) -> tuple:
    """The Dumps of a packet read from a file: its custom options (code, value), its dump comments."""
    texts = [c[len(COMMENT_PREFIX):] for c in comments if c.startswith(COMMENT_PREFIX)]
    out = []
    for code, value in custom:
        if code != OPT_CUSTOM_BINARY:
            continue
        d = from_option(value)
        if d is not None:
            line = next((t for t in texts if t.startswith(d.path + " ") or t.startswith(d.path + "@")), "")
            d.comment = line.split(" = ", 1)[1] if " = " in line else ""
            out.append(d)
    return tuple(out)


assert META_SIZE % 8 == 0 and DUMP.size % 8 == 0
