"""Many functions, one program: which points a capture runs together through a multi-attach link (grouped by kind;
the attach cookie says what the program does differently per point), the program's stand-in point, and the attach
that drops the functions the kernel refuses instead of failing them all."""

from __future__ import annotations

from typing import NamedTuple

from bpf.errors import BPFError
from bpf.link import Link
from bpf.uapi import ProgType

from fcap.kernel import drops, epbopts, pointinfo, track
from fcap.points import kinds
from fcap.points.spec import Point

TRACE_FUNCTIONS = ("/sys/kernel/tracing/available_filter_functions",
                   "/sys/kernel/debug/tracing/available_filter_functions")
MIN_GROUP = 2         # points of one key that share a program (fewer: a program each, as before)
MAX_TRAMPOLINE_ARGS = 12   # arguments a trampoline takes at all (the kernel's MAX_BPF_FUNC_ARGS)
MAX_STRUCT_ARG = 16        # bytes of a struct a trampoline takes by value (two registers)


class Group(NamedTuple):
    """Points that share one program: `kind` a multi kind (one link, the attach cookie the point id), or None (one
    point, its own program and link)."""

    kind: kinds.Kind | None
    points: list[Point]


def multi_kind(kind: kinds.Kind) -> kinds.Kind | None:
    """The best multi kind this kernel allows for points of `kind` (the probes decide), or None."""
    for m in kinds.multi_for(kind):
        if m.probe() is None:
            return m
    return None


def _key(m: kinds.Kind, p: Point, by_direction: bool) -> tuple | None:
    """What the shared program must have alike at every point of a group: its kind (which arguments are the skb
    and the drop reason, the direction and the queue come with the cookie, fcap.kernel.pointinfo; the direction is
    in the key too where the filter or -Q is built for it). None where the point keeps a program of its own
    (tracing-multi: the program's BTF object is vmlinux; an argument past those the kind or the cookie reaches)."""
    if m is not kinds.KPROBE_MULTI and p.btf.base is not None:
        return None
    reason = drops.reason_arg(p)
    if not pointinfo.holds(p.skb_index, reason) or not m.has_arg(p.skb_index) or \
            reason is not None and not m.has_arg(reason):
        return None
    return (m,) + ((p.direction,) if by_direction else ())


def cookie(p: Point) -> int:
    """The point's attach cookie: its id and its bits (fcap.kernel.pointinfo)."""
    return pointinfo.cookie(p.id, p.direction, epbopts.queue_source(p), track.inside_free(p), p.skb_index,
                            drops.reason_arg(p))


def plan(points: list[Point], allowed: bool = True, by_direction: bool = False) -> list[Group]:
    """The points in groups, in the order of their first point. `allowed` False (per-point predicates or dumps that
    read arguments other than the skb): a group per point. `by_direction`: a program per direction too (the filter
    or a predicate is built for the point's direction)."""
    if not allowed:
        return [Group(None, [p]) for p in points]
    kind_for = {k: multi_kind(k) for k in {p.kind for p in points} if kinds.multi_for(k)}
    by_key: dict[tuple, list[Point]] = {}
    order: list[tuple] = []
    for i, p in enumerate(points):
        m = kind_for.get(p.kind)
        key = _key(m, p, by_direction) if m is not None else None
        key = key if key is not None else ("single", i)
        if key not in by_key:
            by_key[key] = []
            order.append(key)
        by_key[key].append(p)
    groups = []
    for key in order:
        ps = by_key[key]
        if key[0] == "single" or len(ps) < MIN_GROUP:
            groups += [Group(None, [p]) for p in ps]
        else:
            groups.append(Group(key[0], ps))
    return groups


def stand_in(kind: kinds.Kind, points: list[Point]) -> Point:
    """The point a group's program is built for: the first point's function and skb argument, the multi kind."""
    first = points[0]
    p = Point(kind, first.name, first.btf, first.btf_id, first.params, first.skb_index, ret=first.ret)
    p.id, p.origin, p.alias = first.id, first.origin, first.alias
    return p


def traceable() -> set[str] | None:
    """The functions ftrace can patch (available_filter_functions), None where tracefs cannot be read."""
    for path in TRACE_FUNCTIONS:
        try:
            with open(path) as f:
                lines = f.read().split("\n")
        except OSError:
            continue
        # ("name" a line, "name [module]" for a module's; split at C speed, the few module lines by name)
        names = set(lines)
        names.update(line.split(None, 1)[0] for line in lines if " " in line)
        names.discard("")
        return names
    return None


def _by_value(t) -> int | None:
    """The size of a struct or union passed or returned by value (type `t`), else None."""
    t = t.strip() if t is not None else None
    return t.size if t is not None and t.kind in ("struct", "union") else None


def trampoline_refusal(p: Point) -> str | None:
    """Why the kernel refuses a trampoline at function `p`, from its prototype as the kernel reads it (its BTF
    function model: measured on 7.2, these are the functions a tracing-multi link refuses): None where it takes
    one."""
    if len(p.params) > MAX_TRAMPOLINE_ARGS:
        return f"{len(p.params)} arguments (a trampoline takes up to {MAX_TRAMPOLINE_ARGS})"
    func = p.btf.type(p.btf_id)
    if getattr(getattr(func, "proto", None), "variadic", False):
        return "variadic (a trampoline takes a fixed list of arguments)"
    if _by_value(p.ret) is not None:
        return "returns a struct or union by value (a trampoline cannot)"
    big = next((a for a in p.params if (_by_value(a.type) or 0) > MAX_STRUCT_ARG), None)
    if big is not None:
        return f"passes {big.name or 'an argument'} by value, over {MAX_STRUCT_ARG} bytes (a trampoline cannot)"
    return None


def attach(kind: kinds.Kind, prog_fd: int, points: list[Point], links: list[Link],
           names: set[str] | None = None) -> list[tuple[Point, str]]:
    """Attach the program at every point, links appended to `links` as they are made (so that an interrupt leaves
    them to be closed). The kernel takes a link's functions all or none: functions ftrace cannot patch (not in
    `names`, traceable()'s answer, read once for all groups: its 40,000 lines are most of a group's attach time
    otherwise) are left out first, so are those a trampoline cannot take (trampoline_refusal), and a link the
    kernel still refuses is halved until each function it refuses is found. Returns (point, why) of those
    refused."""
    refused: list[tuple[Point, str]] = []
    names = traceable() if names is None else names
    if names is not None:
        refused += [(p, "not traceable (not in available_filter_functions: notrace or inlined)")
                    for p in points if p.name not in names]
        points = [p for p in points if p.name in names]
    if kind.prog_type == ProgType.TRACING:   # (what a trampoline cannot take, left out before trying)
        whys = [(p, trampoline_refusal(p)) for p in points]
        refused += [(p, f"the kernel refuses it: {why}") for p, why in whys if why is not None]
        points = [p for p, why in whys if why is None]
    if not points:
        return refused
    return refused + _halve(kind, prog_fd, points, links)


def _halve(kind: kinds.Kind, prog_fd: int, points: list[Point], links: list[Link]) -> list[tuple[Point, str]]:
    try:
        links.append(kind.attach_many(prog_fd, points, [cookie(p) for p in points]))
        return []
    except BPFError as e:
        if len(points) == 1:
            return [(points[0], f"the kernel refused it ({getattr(e, 'errname', e)})")]
    half = len(points) // 2
    return _halve(kind, prog_fd, points[:half], links) + _halve(kind, prog_fd, points[half:], links)
