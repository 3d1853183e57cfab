"""Dropped packets: the drop reason and location a drop point's program records, and their names in user space
(the reason from this kernel's BTF enum skb_drop_reason, never a table of our own; the location from
/proc/kallsyms when it is readable)."""

from __future__ import annotations

from bpf.asm import DW, FP, R0, R1, R2, R7, label, ldx
from bpf.btf import BTF, BTFError, Enum, Enum64, Type

from fcap.host import kallsyms
from fcap.kernel import pointinfo
from fcap.kernel.parts import DEVICE, Part
from fcap.kernel.layout import META, STACK
from fcap.points.kinds import CallerSlots
from fcap.points.spec import Point

# The points every packet of which is being dropped: the tracepoint and the functions that free with a drop reason
# (epb_verdict TC_ACT_SHOT on each record: fcap.kernel.epbopts; "dropped" in `fcap path`)
DROP_POINTS = frozenset(("kfree_skb", "kfree_skb_reason", "sk_skb_reason_drop", "kfree_skb_list_reason"))
DROP_ALIAS = "skb:drop"   # the semantic point (fcap.points.semantic) over them
REASON_ENUM = "skb_drop_reason"
PREFIXES = ("SKB_DROP_REASON_", "SKB_")   # stripped from the names users see: NO_SOCKET, CONSUMED


def _arg(point: Point, name: str, enum: bool) -> int | None:
    """The index of the point's argument `name` (an enum skb_drop_reason when `enum`), or None."""
    for i, p in enumerate(point.params):
        t = p.type.strip()
        if p.name == name and (not enum or (t.kind == "enum" and t.name == REASON_ENUM)):
            return i
    return None


def reason_arg(point: Point) -> int | None:
    return _arg(point, "reason", True)


def location_arg(point: Point) -> int | None:
    return _arg(point, "location", False) if not point.kind.function else None


def base_name(name: str) -> str:
    """A point's function or tracepoint as a file names its interface: KIND/NAME and KIND/NAME:... -> NAME (a
    semantic point's name, skb:drop, stays whole)."""
    return name.rsplit("/", 1)[-1].split(":", 1)[0] if "/" in name else name


def drops_every_packet(name: str) -> bool:
    """Whether every packet at a point is being dropped, by the point's name: a function's or tracepoint's (NAME),
    or as a file names its interface (base_name; skb:drop)."""
    return base_name(name) in DROP_POINTS or name == DROP_ALIAS


def is_drop_point(point: Point) -> bool:
    """A point whose records say why and where a packet was dropped: kfree_skb (also on kernels whose tracepoint
    has no reason yet), or any point with an enum skb_drop_reason argument."""
    return point.name == "kfree_skb" and not point.kind.function or reason_arg(point) is not None


def emit_meta(b) -> None:
    """The program's part: META's reason and location from the point's arguments (other points leave them 0:
    each point has its own scratch value, zero at creation); at a function that drops, the location is its
    return address where the kind can read it (Kind.load_caller: kprobes). A multi-attach program: the reason
    from the argument the attach cookie names, where it names one (fcap.kernel.pointinfo), and the location so."""
    p = b.point
    caller = p.kind.load_caller(R0, CallerSlots(STACK.ctx, STACK.tmp, STACK.frames, b.fresh("caller"))) \
        if p.kind.function else None
    if p.kind.multi:
        none = b.fresh("no_reason")
        b.emit(pointinfo.reason_arg(R2, none), ldx(DW, R1, FP, STACK.ctx), p.kind.load_arg_at(R0, STACK.tmp, none),
               META.store(R7, "reason", R0))
        if caller is not None:
            b.emit(caller, META.store(R7, "location", R0))
        b.emit(label(none))
        return
    for field, index in (("reason", reason_arg(p)), ("location", location_arg(p))):
        if index is None:
            continue
        b.emit(ldx(DW, R1, FP, STACK.ctx), ldx(DW, R0, R1, p.kind.arg_offset(index)), META.store(R7, field, R0))
    if caller is not None and reason_arg(p) is not None:
        b.emit(caller, META.store(R7, "location", R0))


def _records_drops(point, options, maps) -> bool:
    """At a drop point; in every multi-attach program (its cookie says where: a few instructions elsewhere)."""
    return point.kind.multi or reason_arg(point) is not None or location_arg(point) is not None


DROP_META = Part("drop reason", on=_records_drops, stages={DEVICE: emit_meta}, fields=("reason", "location"),
                    reads="fcap.features.drop_reason.DropNames")


# ---- user space: names ---------------------------------------------------------------------------------------

def short(name: str) -> str:
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def reason_enum(btf: BTF | None = None) -> Enum | Enum64 | None:
    try:
        btf = btf or BTF.vmlinux()
        t = btf.find(REASON_ENUM, "enum")
    except BTFError:
        return None
    return t if isinstance(t, (Enum, Enum64)) else None


def reason_value(leaf: Type, text: str) -> int | None:
    """The value of an enum skb_drop_reason name as users write it (NO_SOCKET, or the whole name), else None."""
    values = getattr(leaf, "values", {})
    if text in values:
        return values[text]
    for name, v in values.items():
        if short(name) == text:
            return v
    return None


def close_names(leaf: Type, text: str, n: int = 4) -> list[str]:
    """The enum's names (short where it has the drop reason prefixes) closest to `text`."""
    names = [short(k) for k in getattr(leaf, "values", {})]
    from difflib import get_close_matches
    return get_close_matches(short(text.upper()), names, n=n, cutoff=0.6)


class Names:
    """Names for drop records: reasons from this kernel's BTF, locations from /proc/kallsyms (fcap.host.kallsyms:
    unreadable or hidden addresses leave the location as a number)."""

    def __init__(self, btf: BTF | None = None):
        enum = reason_enum(btf)
        self.reasons = {v: short(k) for k, v in enum.values.items()} if enum is not None else {}
        kallsyms.shared().load()   # (before the first record: see fcap.host.kallsyms)

    def reason(self, value: int) -> str:
        return self.reasons.get(value, str(value))

    def location(self, addr: int) -> str:
        if not addr:
            return "?"
        return kallsyms.shared().name(addr, module=False)

    def describe(self, rec, has_reason: bool = True) -> str:
        """'NO_SOCKET at FUNC+0xOFF' (as fcap path says it)."""
        return (f"{self.reason(rec.reason)} " if has_reason else "") + f"at {self.location(rec.location)}"


def note(points: list[Point]) -> str:
    """One line when a drop point of this kernel carries no reason (kfree_skb before Linux 5.17), else ""."""
    for p in points:
        if is_drop_point(p) and reason_arg(p) is None:
            return (f"note: {p.spec} on this kernel has no drop reason argument (Linux 5.17+): its records name "
                    f"the location only")
    return ""
