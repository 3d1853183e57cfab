"""Capture points: the -i grammar, discovery from BTF (list-devices, info), and the skb argument of each point."""

from __future__ import annotations

import fnmatch
from typing import NamedTuple

from bpf.btf import BTF, BTFError, Func, FuncProto, Ptr, Type
from bpf.cdecl import c_decl

from fcap.errors import PointError
from fcap.points import kinds
from fcap.points.kinds import Kind

SKB = kinds.SKB_STRUCT
TP_PREFIX = "btf_trace_"


class Argument(NamedTuple):
    """A capture point's argument: its name (made up where BTF has none) and type (a BTF Param gives both)."""

    name: str
    type: Type

    def c(self) -> str:
        return c_decl(self.type, self.name)


class Point:
    """A resolved capture point. A capture numbers its points (id) and names what serves a semantic point (alias)
    after resolving them."""

    __slots__ = ("kind", "name", "btf", "btf_id", "params", "skb_index", "ret", "id", "origin", "alias", "target",
                 "_skbs")

    def __init__(self, kind: Kind, name: str, btf: BTF, btf_id: int, params: list[Argument], skb_index: int,
                 ret: Type | None = None):
        self.kind = kind              # fcap.points.kinds: FENTRY, FEXIT, TP_BTF, RAW_TP, KPROBE
        self.name = name              # function or tracepoint name
        self.btf = btf                # the BTF that holds it (vmlinux or a module's)
        self.btf_id = btf_id          # FUNC id (functions) or btf_trace_NAME typedef id (tracepoints)
        self.params = params          # the context arguments, in order (tracepoints: after the leading void *)
        self.skb_index = skb_index    # which of them is the skb
        self.ret = ret                # return type (functions)
        self.id = 0                   # this point's number in a capture (records carry it)
        self.origin = ""              # the -i glob it came from ("" when named on its own)
        self.alias = ""               # the semantic point it serves (skb:drop, ...), if any
        self.target = None            # a point on a BPF program: the program (fcap.points.progpoints.Target)
        self._skbs: int | None = None  # how many of the arguments are skbs (spec: counted once)

    def __repr__(self) -> str:
        return f"Point({self.label!r}, id={self.id})"

    @property
    def label(self) -> str:
        """How users see it: the spec, or the semantic point and the hook that serves it."""
        return f"{self.alias} ({self.spec})" if self.alias else self.spec

    @property
    def if_name(self) -> str:
        return self.alias or self.spec

    def if_description(self) -> str:
        """The pcapng interface's description: the prototype, after the hook when a semantic point is served."""
        return f"{self.spec}: {self.prototype()}" if self.alias else self.prototype()

    @property
    def spec(self) -> str:
        if self._skbs is None:
            self._skbs = sum(1 for p in self.params if is_skb_ptr(p.type))
        suffix = f":{self.params[self.skb_index].name or self.skb_index}" if self._skbs > 1 else ""
        return f"{self.kind}/{self.name}{suffix}"

    @property
    def module(self) -> str:
        return self.btf.name or "vmlinux"

    @property
    def is_function(self) -> bool:
        return self.kind.function

    @property
    def typed(self) -> bool:
        """Does the verifier know the context's types (so the skb is a trusted BTF pointer)?"""
        return self.kind.typed

    @property
    def copies_bytes(self) -> bool:
        """Does the program copy the packet's bytes itself (probe reads) rather than hand the skb to a helper that
        copies from it (bpf_skb_output, skb dynptrs)? Untyped points, XDP's (no skb), fexit's (the skb may be
        gone)."""
        return not self.typed or not self.kind.on_skb or self.kind.skb_may_be_gone

    @property
    def direction(self) -> str | None:
        if self.kind.on_program:   # XDP: received; tc: either way, as attached
            return "in" if self.kind.context == kinds.XDP_STRUCT else None
        return direction_of(self.name)

    @property
    def device_layer(self) -> bool:
        """Is a link-layer header in place (EN10MB by default)?"""
        return self.kind.on_program or is_device_point(self.name)

    def prototype(self) -> str:
        try:
            return c_prototype(self.ret, self.name, self.params)
        except BTFError as e:
            raise PointError(f"{self.kind}/{self.name}: cannot read the kernel's BTF: {e}") from None


def is_skb_ptr(t: Type) -> bool:
    t = t.strip()
    if not isinstance(t, Ptr):
        return False
    target = t.target.strip()
    return target.kind == "struct" and target.name == SKB


def c_prototype(ret: Type | None, name: str, params: list[Argument]) -> str:
    ret_c = c_decl(ret) if ret is not None else "void"
    args = ", ".join(p.c() if p.name else c_decl(p.type) for p in params) or "void"
    sep = "" if ret_c.endswith("*") else " "
    return f"{ret_c}{sep}{name}({args})"


_OUT_WORDS = ("xmit", "output", "_send", "queue", "transmit", "_tx", "finish_output", "_out")
_IN_WORDS = ("rcv", "receive", "_rx", "recv", "_input", "netif_rx", "gro_", "_in_")


# Points that send an answer to a received packet and see that packet, not the answer: their skb goes in
_REPLY_WORDS = ("icmp_send", "icmp6_send", "icmpv6_send", "icmp_reply", "send_reset", "send_ack", "send_synack",
                "send_unicast_reply", "send_challenge_ack")


def direction_of(name: str) -> str | None:
    """The way the packets a point sees are going, guessed from the name: 'out', 'in' or None. A point that
    answers a packet (icmp_send, tcp_v4_send_reset) sees the packet it answers: in."""
    n = name.lower()
    if any(w in n for w in _REPLY_WORDS + _IN_WORDS):
        return "in"
    if any(w in n for w in _OUT_WORDS):
        return "out"
    return None


DEVICE_WORDS = ("net_dev_", "netif_", "napi_", "dev_queue_xmit", "dev_hard_start_xmit", "__dev_queue_xmit",
                "dev_xmit", "xdp", "_start_xmit", "__netif", "packet_rcv", "dev_forward_skb", "dev_loopback_xmit")


def is_device_point(name: str) -> bool:
    """Points at the device layer, where a link-layer header is in place."""
    n = name.lower()
    return any(w in n for w in DEVICE_WORDS) or n.endswith("_xmit")


def suggestion(name: str) -> str:
    """Tracepoints that see what a function sees, for kernels that refuse fentry/kprobe."""
    d = direction_of(name)
    if "kfree_skb" in name or "drop" in name:
        return "tp_btf/kfree_skb"
    if d == "in":
        return "tp_btf/netif_receive_skb"
    if d == "out":
        return "tp_btf/net_dev_queue"
    return "tp_btf/net_dev_queue (transmit) or tp_btf/netif_receive_skb (receive)"


# ---- resolution -------------------------------------------------------------------------------

def parse(spec: str) -> tuple[Kind | None, str, str | None]:
    """'fentry/ip_output:skb' → (kinds.FENTRY, 'ip_output', 'skb'); 'tp/net/net_dev_queue' → (kinds.TP_BTF, ...);
    a bare name → (None, name, None)."""
    spec = spec.strip()
    if not spec:
        raise PointError("empty capture point")
    word, sep, rest = spec.partition("/")
    kind = kinds.get(word)
    if not sep:
        kind, rest = None, spec
    elif kinds.program_kinds(word):
        raise PointError(f"{spec}: {word}/PROG names a BPF program's entry and exit, not a function or tracepoint "
                         f"(capture there with -i {spec})")
    elif word == "tp":
        sub, sep2, rest = rest.partition("/")
        if not sep2 or not sub:
            raise PointError(f"{spec}: tracepoints are spelled tp/SUBSYSTEM/NAME or tp_btf/NAME")
        kind = kinds.TP_BTF
    elif word == "kretprobe":
        raise PointError(f"{spec}: a kretprobe sees only the return value, not the skb; use fexit/{rest}")
    elif kind is None:
        raise PointError(f"{spec}: unknown attach kind {word!r} (known: {', '.join(kinds.names())}, tp)")
    name, _, arg = rest.partition(":")
    if not name:
        raise PointError(f"{spec}: no function or tracepoint name")
    return kind, name, arg or None


def _find_func(name: str) -> tuple[BTF, Func] | None:
    for btf in _btfs():
        for f in btf.find_all(name, "func"):
            if f.btf is btf:   # a module's own function, not its base's namesake
                return btf, f
    return None


def _find_tracepoint(name: str) -> tuple[BTF, Type, FuncProto] | None:
    """The btf_trace_NAME typedef (a pointer to the tracepoint's prototype), in vmlinux or a module."""
    for btf in _btfs():
        td = next((t for t in btf.find_all(TP_PREFIX + name, "typedef") if t.btf is btf), None)
        if td is None:
            continue
        proto = td.strip()
        proto = proto.target.strip() if isinstance(proto, Ptr) else proto
        if isinstance(proto, FuncProto):
            return btf, td, proto
    return None


def _btfs():
    """vmlinux, then each module's BTF (loaded only when the search gets that far)."""
    yield BTF.vmlinux()
    for mod in BTF.module_names():
        try:
            yield BTF.module(mod)
        except BTFError:
            continue


def _module_hint(name: str) -> str:
    """Where a function missing from BTF lives in a module that has no BTF (kernels before 5.11 have none)."""
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                if line.endswith("]\n") and line.split(None, 3)[2:3] == [name]:
                    mod = line.rsplit("[", 1)[1].rstrip("]\n")
                    if mod not in BTF.module_names():
                        return (f"; it is in module {mod}, which has no BTF on this kernel (module BTF: Linux 5.11+, "
                                f"CONFIG_DEBUG_INFO_BTF_MODULES)")
                    return ""
    except OSError:
        pass
    return ""


def _pick_skb(spec: str, params: list[Argument], arg: str | None) -> int:
    skbs = [i for i, p in enumerate(params) if is_skb_ptr(p.type)]
    if not skbs:
        raise PointError(f"{spec}: no struct sk_buff * parameter")
    if arg is None:
        return skbs[0]
    for i in skbs:
        if params[i].name == arg or str(i) == arg:
            return i
    names = ", ".join(params[i].name or str(i) for i in skbs)
    raise PointError(f"{spec}: no struct sk_buff * parameter called {arg!r} (there are: {names})")


# Functions that free the skb they are given (or its data): at their return its memory may already be another
# packet's, so a program there would read guarded but stale bytes. Not at fexit/fmod_ret points (a record is true
# or it is not written): their entry, or the kfree_skb/consume_skb tracepoints, see the packet whole.
FREES_SKB = frozenset((
    "kfree_skb", "kfree_skb_reason", "sk_skb_reason_drop", "consume_skb", "__kfree_skb", "kfree_skbmem",
    "kfree_skb_list", "kfree_skb_list_reason", "kfree_skb_partial", "napi_consume_skb", "__napi_kfree_skb",
    "_kfree_skb_defer", "napi_skb_cache_put", "dev_kfree_skb_any_reason", "dev_kfree_skb_irq_reason",
    "__dev_kfree_skb_any", "__dev_kfree_skb_irq", "__consume_stateless_skb", "skb_release_all", "skb_release_data",
    "skb_free_head"))


def _func_point(spec: str, kind: Kind, name: str, btf: BTF, func: Func, arg: str | None) -> Point:
    if kind.skb_may_be_gone and name in FREES_SKB:
        raise PointError(f"{spec}: {name} frees the skb: when it returns, the packet's memory may be another's "
                         f"already; capture at fentry/{name} (or tp_btf/kfree_skb, tp_btf/consume_skb)")
    proto = func.proto
    params = [Argument(p.name, p.type) for p in proto.params]
    return Point(kind, name, btf, func.id, params, _pick_skb(spec, params, arg), ret=proto.ret)


def _tp_point(spec: str, kind: Kind, name: str, btf: BTF, type_id: int, proto: FuncProto, arg: str | None) -> Point:
    types = [p.type for p in proto.params[1:]]  # drop the leading void *__data
    nskb = sum(is_skb_ptr(t) for t in types)
    params = [Argument(p.name or ("skb" if is_skb_ptr(t) and nskb == 1 else tp_arg_name(name, i, t)), t)
              for i, (p, t) in enumerate(zip(proto.params[1:], types))]
    return Point(kind, name, btf, type_id, params, _pick_skb(spec, params, arg))


def tracepoint(name: str, kind: Kind = kinds.TP_BTF) -> Point | None:
    """KIND/NAME (kinds.TP_BTF or kinds.RAW_TP) whatever its arguments (a program that takes no skb:
    fcap.kernel.track's helpers), or None where this kernel has no such tracepoint. Its skb_index is 0: unused."""
    found = _find_tracepoint(name)
    if found is None:
        return None
    btf, td, proto = found
    params = [Argument(p.name or tp_arg_name(name, i, p.type), p.type) for i, p in enumerate(proto.params[1:])]
    return Point(kind, name, btf, td.id, params, 0)


# Tracepoint arguments have no names in BTF (btf_trace_NAME's prototype); these are the kernel's own (TP_PROTO),
# for the arguments --where and the drop records use. Any other unnamed argument is argN.
TP_ARG_NAMES = {("kfree_skb", 1): "location", ("kfree_skb", 2): "reason", ("kfree_skb", 3): "rx_sk",
                ("consume_skb", 1): "location"}


def tp_arg_name(tracepoint: str, index: int, t: Type) -> str:
    name = TP_ARG_NAMES.get((tracepoint, index))
    if name is None and t.strip().kind == "enum" and t.strip().name == "skb_drop_reason":
        name = "reason"
    return name or f"arg{index}"


def resolve(spec: str, default_func_kind: Kind = kinds.FENTRY) -> Point:
    """Resolve a -i argument into a Point; raises PointError with one clear line."""
    kind, name, arg = parse(spec)
    try:
        if kind is None:
            # a bare name: a tracepoint by that name, else a function with the best hook available
            if _find_func(name) is None and _find_tracepoint(name) is not None:
                kind = kinds.TP_BTF
            else:
                kind = default_func_kind
        if kind.function:
            found = _find_func(name)
            if found is None:
                hint = f"; a tracepoint has that name: tp_btf/{name}" if _find_tracepoint(name) else _module_hint(name)
                raise PointError(f"{spec}: no kernel function {name!r} in BTF{hint}")
            return _func_point(spec, kind, name, *found, arg)
        found_tp = _find_tracepoint(name)
        if found_tp is None:
            hint = f"; a function has that name: fentry/{name}" if _find_func(name) else ""
            raise PointError(f"{spec}: no tracepoint {name!r} in BTF{hint}")
        btf, td, proto = found_tp
        return _tp_point(spec, kind, name, btf, td.id, proto, arg)
    except BTFError as e:
        raise PointError(f"{spec}: cannot read the kernel's BTF: {e}") from None


# ---- globs -------------------------------------------------------------------------------------

GLOB_CHARS = "*?["


def is_glob(spec: str) -> bool:
    return any(c in spec.partition(":")[0] for c in GLOB_CHARS)


def expand(spec: str, default_func_kind: Kind = kinds.FENTRY) -> list[Point]:
    """Every point a glob names (fnmatch over the names list-devices prints): KIND/GLOB over that kind's names,
    a bare GLOB over tracepoints (tp_btf) and functions (default_func_kind). With :ARG, the matches that have an
    skb argument of that name. PointError when nothing matches."""
    kind, pattern, arg = parse(spec)
    out: list[Point] = []
    seen: set[str] = set()
    try:
        for found, name, btf, obj in _candidates(kind is None or not kind.function,
                                                 kind is None or kind.function):
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            k = kind or (default_func_kind if found.function else found)
            try:
                p = _func_point(spec, k, name, btf, obj, arg) if found.function else \
                    _tp_point(spec, k, name, btf, *obj, arg)
            except PointError:   # no skb argument called ARG here
                continue
            if p.spec not in seen:
                seen.add(p.spec)
                p.origin = spec
                out.append(p)
    except BTFError as e:
        raise PointError(f"{spec}: cannot read the kernel's BTF: {e}") from None
    if not out:
        what = "tracepoint or function" if kind is None else "function" if kind.function else "tracepoint"
        with_arg = f" with a struct sk_buff * argument called {arg!r}" if arg else " taking a struct sk_buff *"
        raise PointError(f"{spec}: no {what}{with_arg} matches {pattern!r} (fcap list-devices lists them)")
    return out


def _candidates(tracepoints: bool, functions: bool):
    """(kind, name, btf, what) of every tracepoint (kinds.TP_BTF, what = (typedef id, prototype)) and function
    (kinds.FENTRY, what = its Func) taking a struct sk_buff *, vmlinux first, then modules."""
    btfs = list(_btfs())
    if tracepoints:
        for btf in btfs:
            for td_name, proto in btf.typedefs_to_func_proto(TP_PREFIX):
                if not any(is_skb_ptr(p.type) for p in proto.params[1:]):
                    continue
                td = next((t for t in btf.find_all(td_name, "typedef") if t.btf is btf), None)
                if td is not None:
                    yield kinds.TP_BTF, td_name[len(TP_PREFIX):], btf, (td.id, proto)
    if functions:
        for btf in btfs:
            for func, _idx in btf.funcs_taking_pointer_to(SKB):
                yield kinds.FENTRY, func.name, btf, func


# ---- discovery ---------------------------------------------------------------------------------

class Listing(NamedTuple):
    spec: str
    kind: str      # the kind's name
    name: str
    module: str
    prototype: str


def list_points(pattern: str | None = None) -> list[Listing]:
    """Every function and tracepoint taking a struct sk_buff * (vmlinux, then modules) whose name or spec matches
    the glob `pattern`; the whole list cached per boot (bpf.btf_cache), keyed by the BTF files it came from."""
    items = _all_points()
    if pattern:
        items = [i for i in items if fnmatch.fnmatch(i.name, pattern) or fnmatch.fnmatch(i.spec, pattern)]
    return items


def _all_points() -> list[Listing]:
    from bpf import btf_cache
    here = [__file__, c_decl.__code__.co_filename]   # (the code that makes the list is part of its key)
    try:
        ident = btf_cache.key(*BTF.files(), *here)
    except OSError:
        ident = None
    data = btf_cache.read("points", ident) if ident else None
    if data is not None:
        rows = [line.split("\t") for line in bytes(data).decode(errors="replace").splitlines()]
        if all(len(r) == 5 for r in rows):
            return [Listing(*r) for r in rows]
    items = _scan_points()
    if ident:
        btf_cache.write("points", ident, "".join("\t".join((i.spec, i.kind, i.name, i.module, i.prototype)) + "\n"
                                                 for i in items).encode())
    return items


def _scan_points() -> list[Listing]:
    out: list[Listing] = []
    seen: set[str] = set()
    for kind, name, btf, obj in _candidates(True, True):
        spec = f"{kind}/{name}"
        if kind.function:
            text = c_decl(obj)
        else:
            if name in seen:
                continue
            seen.add(name)
            text = _tp_point(spec, kind, name, btf, *obj, None).prototype()
        out.append(Listing(spec, kind.name, name, btf.name or "vmlinux", text))
    return out
