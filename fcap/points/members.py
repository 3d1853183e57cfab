"""BTF member paths over a point's arguments (`skb->dev->name`, `skb->sk->__sk_common`, `return` at fexit): the
argument a path starts from, the pointers loaded on the way and the leaf's offset. --where and --dump use them."""

from __future__ import annotations

import re
from typing import NamedTuple

from bpf.btf import BTFError, Composite, Ptr, Type
from bpf.cdecl import c_decl

from fcap.errors import PathError
from fcap.points.spec import Point

PATH = re.compile(r"^\s*(?:[A-Za-z_]\w*)(?:\s*(?:->|\.)\s*[A-Za-z_]\w*)*\s*$")
MEMBERS_SHOWN = 40       # a missing member's message names at most this many of the members that exist


class Step(NamedTuple):
    deref: bool        # '->' (load the pointer, then go into what it points to) or '.' / the root
    name: str


def parse_path(path: str) -> list[Step]:
    tokens = re.findall(r"->|\.|[A-Za-z_]\w*", path)
    steps = [Step(False, tokens[0])]
    for sep, name in zip(tokens[1::2], tokens[2::2]):
        steps.append(Step(sep == "->", name))
    return steps


def root(point: Point, path: str, name: str, flag: str) -> tuple[int, Type]:
    """The context argument a path starts from: (its index, its type); `return` at fexit is past the arguments."""
    names = [p.name for p in point.params]
    if name == "return":
        if not point.kind.sees_return:
            raise PathError(f"{flag} {path}: 'return' exists only at fexit points")
        if point.ret is None or point.ret.strip().kind == "void":
            raise PathError(f"{flag} {path}: {point.name} returns nothing")
        arg_index, t = len(point.params), point.ret
    elif name in names:
        arg_index = names.index(name)
        t = point.params[arg_index].type
    elif name == "skb":
        arg_index, t = point.skb_index, point.params[point.skb_index].type
    else:
        more = ", return" if point.kind.sees_return else ""
        raise PathError(f"{flag} {path}: no argument {name!r} at {point.spec} "
                        f"(arguments: {', '.join(n for n in names if n) or 'none'}{more})")
    if not point.kind.has_arg(arg_index):
        raise PathError(f"{flag} {path}: argument {arg_index + 1} is past the registers")
    return arg_index, t


def walk(path: str, steps: list[Step], t: Type, flag: str) -> tuple[list[int], int, tuple[int, int] | None, Type]:
    """Walk the path through BTF: the offsets of the pointers loaded on the way, then the leaf's offset (and its
    bits) in the last object, and the leaf's type."""
    chain: list[int] = []
    off = 0
    bits_at: tuple[int, int] | None = None
    walked = steps[0].name
    in_object = False     # at the root, the register holds the argument's value itself
    for st_ in steps[1:]:
        t = t.strip()
        if st_.deref:
            if not isinstance(t, Ptr):
                raise PathError(f"{flag} {path}: {walked} is not a pointer ({c_decl(t)})")
            if in_object:
                chain.append(off)
            t, off, in_object = t.target.strip(), 0, True
        elif not in_object or isinstance(t, Ptr):
            raise PathError(f"{flag} {path}: {walked} is a pointer: use -> before {st_.name}")
        mem, bits = member(path, t, st_.name, walked, flag)
        bits_at = (off * 8 + bits, mem.bitfield_size) if mem.bitfield_size else None
        off += bits // 8
        t = mem.type
        walked += ("->" if st_.deref else ".") + st_.name
    return chain, off, bits_at, t


def member(path: str, t: Type, name: str, walked: str, flag: str):
    """The member `name` of t and its bit offset; a missing one is said with the members that exist."""
    if not isinstance(t, Composite):
        raise PathError(f"{flag} {path}: {walked} is not a struct or union ({c_decl(t)})")
    try:
        return t.member(name)
    except BTFError:
        names = member_names(t)
        shown = ", ".join(names[:MEMBERS_SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > MEMBERS_SHOWN
                                                    else "")
        raise PathError(f"{flag} {path}: {c_decl(t)} has no member {name!r} (members: {shown or 'none'})") from None


def member_names(t: Composite, depth: int = 0) -> list[str]:
    """The names a path can use after t: its members, those of anonymous members in their place."""
    out: list[str] = []
    for m in t.members:
        if m.name:
            out.append(m.name)
            continue
        inner = m.type.strip()
        if isinstance(inner, Composite) and depth < 16:
            out += member_names(inner, depth + 1)
    return out
