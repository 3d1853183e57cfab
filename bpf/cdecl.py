"""C declarations of BTF types, by the rules of libbpf's btf_dump (what `bpftool btf dump ... format c` writes)."""

from __future__ import annotations

from .btf_types import (MAX_CHAIN, Array, Const, Func, FuncProto, Ptr, Restrict, Table, Type, TypeTag, Var,
                        Volatile)
from .errors import BTFError


def c_decl(t: Type, name: str = "") -> str:
    """C declaration of `name` as type `t`: `struct sk_buff *skb`, `int (*fn)(int)`, `char name[16]`; of a FUNC or
    VAR, named after it unless `name` is given: `int ip_send_skb(struct net *net, struct sk_buff *skb)`."""
    try:
        if isinstance(t, (Func, Var)):
            return _decl(t.btf, t.target_id, name or t.name)
        return _decl(t.btf, t.id, name)
    except RecursionError:  # only a corrupt blob has a type that contains itself
        raise BTFError(f"declare {t.kind} [{t.id}] {t.name}".rstrip(), "loop of type references") from None


_MISSING = ("", False)
_QUALIFIERS = ("volatile", "const", "restrict")


def _decl(btf: Table, type_id: int, name: str) -> str:
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


def _parts(btf: Table, type_id: int) -> tuple[str, bool] | None:
    """(declaration without a name, whether it ends in `*`), cached; None where the name goes inside."""
    parts = btf.decl_cache.get(type_id, _MISSING)
    if parts is _MISSING:
        stack = _stack(btf.type(type_id))
        parts = None
        if not any(isinstance(s, (Array, FuncProto)) for s in stack):
            out: list[str] = []
            last_was_ptr = _chain(stack, "", out)
            parts = ("".join(out), last_was_ptr)
        btf.decl_cache[type_id] = parts
    return parts


def _stack(t: Type) -> list[Type]:
    """The declarator chain from `t` (outermost) to the type that names it (innermost)."""
    stack = [t]
    while isinstance(t, (Ptr, Volatile, Const, Restrict, TypeTag, Array, FuncProto)):
        t = t.elem if isinstance(t, Array) else t.ret if isinstance(t, FuncProto) else t.target
        stack.append(t)
        if len(stack) > MAX_CHAIN:
            raise BTFError(f"declare {stack[0].kind} [{stack[0].id}]", "loop of type references")
    return stack


def _params(t: FuncProto) -> str:
    btf, raw = t.btf, t._raw()
    variadic = t.variadic
    if variadic:
        raw.pop()
    if not raw:
        return "(void)"
    decls = [_decl(btf, tid, btf.string(name_off) if name_off else "") for name_off, tid in raw]
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
