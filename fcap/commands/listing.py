"""fcap list-devices [--semantic] and fcap info: the capture points this kernel offers, and what each one is."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys

from fcap.commands.console import PROG, fail, quiet_stdout


def cmd_list(argv: list[str]) -> int:
    from bpf.btf import BTFError

    from fcap.points.spec import list_points
    ap = argparse.ArgumentParser(prog=f"{PROG} list-devices", description="every capture point taking an skb")
    ap.add_argument("pattern", nargs="?", help="glob over names, e.g. 'ip_*'")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--semantic", action="store_true",
                    help="the semantic points (ip:send, skb:drop, ...) and the hook each maps to on this kernel")
    a = ap.parse_args(argv)
    if a.semantic:
        return cmd_semantic(a)
    try:
        items = list_points(a.pattern)
    except (BTFError, OSError) as e:
        return fail(f"cannot read the kernel's BTF: {e}")
    programs = loaded_programs(a.pattern)
    out = sys.stdout
    try:
        if a.json:
            import json
            json.dump([{"point": i.spec, "kind": i.kind, "name": i.name, "module": i.module,
                        "prototype": i.prototype} for i in items] +
                      [{"point": r.spec, "kind": r.spec.partition("/")[0], "name": r.name, "id": r.id,
                        "attached": r.attached} for r in programs], out, indent=1)
            out.write("\n")
        else:
            out.write("".join(f"{i.spec}  {i.prototype}{'' if i.module == 'vmlinux' else f'  [{i.module}]'}\n"
                              for i in items))
            out.write("".join(program_line(r) for r in programs))
        out.flush()
    except BrokenPipeError:
        quiet_stdout()
        return 0
    note = refused_kinds() if items else ""
    if note:
        sys.stderr.write(f"{PROG}: {note}\n")
    if a.pattern and not items and not programs:
        return fail(f"no capture point matches {a.pattern!r}")
    return 0


def program_line(r) -> str:
    where = f"attached to {r.attached}" if r.attached else "not attached to a device (that fcap sees)"
    return f"{r.spec}  BPF program id {r.id}, {where}\n"


def loaded_programs(pattern: str | None) -> list:
    """The loaded XDP and tc programs (fcap.points.progpoints.ProgramRow) whose point or name matches `pattern`;
    none when the kernel will not list them (not root)."""
    from bpf.errors import BPFError

    from fcap.points.progpoints import list_programs
    try:
        rows = list_programs()
    except BPFError:
        return []
    return [r for r in rows if not pattern or fnmatch.fnmatch(r.name, pattern) or fnmatch.fnmatch(r.spec, pattern)]


def cmd_semantic(a) -> int:
    """list-devices --semantic: each semantic point, its hook on this kernel (or why none), what it means."""
    from bpf.btf import BTFError

    from fcap.points.semantic import table
    if os.geteuid() != 0:
        return fail("list-devices --semantic probes what this kernel loads: run it as root")
    try:
        choices = [c for c in table() if not a.pattern or fnmatch.fnmatch(c.name, a.pattern)]
    except (BTFError, OSError) as e:
        return fail(f"cannot read the kernel's BTF: {e}")
    try:
        if a.json:
            import json
            rows = [{"point": c.name, "meaning": c.meaning, "hooks": [p.spec for p in c.points],
                     "prototypes": [p.prototype() for p in c.points],
                     "refused": [{"hook": h, "why": w} for h, w in c.refused]} for c in choices]
            json.dump(rows, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(semantic_lines(choices))
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()
    return 0


def semantic_lines(choices) -> str:
    width = max((len(c.hooks) for c in choices), default=1)
    out = []
    for c in choices:
        if not c.points:
            out.append(f"{c.name:<15} {'-':<{width}}  {c.meaning}; this kernel cannot serve it: {c.why_not()}\n")
        else:
            passed = f"; not {c.why_not()}" if c.refused else ""
            out.append(f"{c.name:<15} {c.hooks:<{width}}  {c.meaning}{passed}\n")
    return "".join(out)


def refused_kinds() -> str:
    """One line naming the kinds this kernel refuses (only when we may probe: root)."""
    if os.geteuid() != 0:
        return ""
    from bpf import probes
    from bpf.btf import BTF
    from bpf.uapi import AttachType
    try:
        func = BTF.vmlinux().find("ip_output", "func") or next(BTF.vmlinux().funcs())
    except Exception:  # noqa: BLE001 - only a note
        return ""
    refused = []
    r = probes.tracing_program(AttachType.TRACE_FENTRY, func.id, label="fentry programs")
    if r is not None:
        refused.append(f"fentry/fexit programs: {r.reason}")
    r = probes.kprobe_program()
    if r is not None:
        refused.append(f"kprobe: {r.reason}")
    if not refused:
        return ""
    return "note: on this kernel " + "; ".join(refused) + ". Capture at tp_btf/ points instead."


def info_program(spec: str) -> int:
    """fcap info xdp/PROG: the program's main function, as the points at its entry and exit see it."""
    from fcap.points import progpoints
    from fcap.points.spec import PointError
    try:
        points = progpoints.resolve(spec)
    except PointError as e:
        return fail(str(e))
    p = points[0]
    sys.stdout.write(f"{p.prototype()};  [BPF program id {p.target.id}]\n")
    sys.stdout.write(f"  points: {', '.join(q.spec for q in points)}\n")
    return 0


def cmd_info(argv: list[str]) -> int:
    from fcap.points import progpoints
    from fcap.points.spec import PointError, resolve
    if not argv:
        return fail("usage: fcap info POINT", 2)
    code = 0
    for spec in argv:
        if progpoints.is_program_spec(spec):
            code = info_program(spec) or code
            continue
        try:
            p = resolve(spec)
        except PointError as e:
            code = fail(str(e))
            continue
        where = "" if p.module == "vmlinux" else f"  [{p.module}]"
        sys.stdout.write(f"{p.prototype()};{where}\n")
        sys.stdout.write(f"  point: {p.spec}  skb: argument {p.skb_index} ({p.params[p.skb_index].name})\n")
    return code
