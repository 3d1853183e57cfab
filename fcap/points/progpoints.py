"""Capture points on loaded BPF programs (-i xdp/PROG, tc/PROG, xdp.entry/PROG, ...): the program found by name or
id, its main function in its own BTF, the context argument typed as the kernel's struct; and the XDP and tc programs
loaded, with where they are attached (fcap list-devices)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import NamedTuple

from bpf import objects
from bpf.btf import BTF, BTFError, Ptr, Type
from bpf.errors import BPFError
from bpf.objects import ProgDesc
from bpf.sys import FD
from bpf.uapi import AttachType, LinkType

from fcap.errors import PointError
from fcap.points import kinds
from fcap.points.spec import Argument, Point

ARG_NAME = {kinds.XDP_STRUCT: "xdp", kinds.SKB_STRUCT: "skb"}   # the context argument's name (--where, --dump)


class Target:
    """A loaded program points attach to: what the kernel says of it, and an fd that holds it (attach_prog_fd)."""

    def __init__(self, desc: ProgDesc, fd: FD, name: str):
        self.desc = desc
        self.name = name        # its main function's name (the kernel's program name is cut at 15 characters)
        self._fd = fd

    @property
    def fd(self) -> int:
        return self._fd.fileno()

    @property
    def id(self) -> int:
        return self.desc.id


def is_program_spec(spec: str) -> bool:
    word, sep, _rest = spec.strip().partition("/")
    return bool(sep) and bool(kinds.program_kinds(word))


def resolve(spec: str) -> list[Point]:
    """The points -i `spec` names: xdp/PROG and tc/PROG the program's entry and exit, KIND.entry/PROG or
    KIND.exit/PROG one. PointError with one line when there is no such program, or several by that name."""
    word, _sep, rest = spec.strip().partition("/")
    ks = kinds.program_kinds(word)
    family = ks[0].word
    if not rest:
        raise PointError(f"{spec}: name the program: {family}/NAME or {family}/ID (fcap list-devices lists them)")
    try:
        target = _find(spec, rest, ks[0])
        btf = BTF.load(objects.btf_data(target.desc.btf_id), name=f"prog {target.id}")
        main = btf.type(target.desc.funcs[0][1])
        vm = BTF.vmlinux()
        ret = main.proto.ret
    except BPFError as e:
        raise PointError(f"{spec}: {e}") from None
    except BTFError as e:
        raise PointError(f"{spec}: cannot read the program's BTF: {e}") from None
    out = []
    for k in ks:
        params = [Argument(ARG_NAME[k.context], _pointer_to(vm, k.context))]
        p = Point(k, target.name, vm, main.id, params, 0, ret=ret)
        p.target = target
        out.append(p)
    return out


def _find(spec: str, what: str, kind: kinds.Kind) -> Target:
    prog_type, family, label = kind.target_type, kind.word, kind.label
    article = "an" if label[0] in "AEIOUX" else "a"
    if what.isdigit():
        try:
            fd = objects.open_prog(int(what))
        except BPFError:
            raise PointError(f"{spec}: no loaded BPF program has id {what} (fcap list-devices lists them)") from None
        desc = objects.prog_desc(fd.fileno())
        if desc.type != prog_type:
            raise PointError(f"{spec}: program {what} ({desc.name}) is not {article} {label} program")
        twins = any(d.type == prog_type and d.name == desc.name and d.id != desc.id for d in objects.programs())
        return _target(spec, desc, fd, twins)
    found = []
    for desc in objects.programs():
        if desc.type == prog_type and (desc.name == what or desc.name == what[:15] and _main_name(desc) == what):
            found.append(desc)
    if not found:
        raise PointError(f"{spec}: no loaded {label} program is called {what!r} (fcap list-devices lists them)")
    if len(found) > 1:
        ids = ", ".join(str(d.id) for d in found)
        raise PointError(f"{spec}: {len(found)} {label} programs are called {what!r} (ids {ids}); "
                         f"name one by id: {family}/ID")
    try:
        fd = objects.open_prog(found[0].id)
    except BPFError:
        raise PointError(f"{spec}: program {what} (id {found[0].id}) was unloaded") from None
    return _target(spec, found[0], fd)


def _target(spec: str, desc: ProgDesc, fd: FD, twins: bool = False) -> Target:
    """The program's Target, named by its main function (NAME#ID where other programs have its name, so that the
    points of each have names, and pcapng interfaces, of their own)."""
    if not desc.btf_id or not desc.funcs:
        raise PointError(f"{spec}: program {desc.name} (id {desc.id}) was loaded without BTF function info, which "
                         f"fentry/fexit need to attach to it")
    name = _main_name(desc) or desc.name
    return Target(desc, fd, f"{name}#{desc.id}" if twins else name)


def _main_name(desc: ProgDesc) -> str:
    if not desc.btf_id or not desc.funcs:
        return ""
    try:
        return BTF.load(objects.btf_data(desc.btf_id)).type(desc.funcs[0][1]).name
    except (BPFError, BTFError):
        return ""


def _pointer_to(vm: BTF, struct: str) -> Type:
    """A `struct NAME *` of vmlinux's BTF."""
    target = vm.find(struct, "struct")
    if target is None:
        raise PointError(f"this kernel's BTF has no struct {struct}")
    for t in vm.types("ptr"):
        if isinstance(t, Ptr) and t.target.id == target.id:
            return t
    raise PointError(f"this kernel's BTF has no struct {struct} *")


# ---- listing ----------------------------------------------------------------------------------------------------

class ProgramRow(NamedTuple):
    spec: str          # how -i names it
    id: int
    name: str
    attached: str      # where: "eth0 (xdp link)", "veth1 ingress (tcx)", "" when nowhere fcap can see


def list_programs() -> list[ProgramRow]:
    """The loaded XDP and tc programs with where they are attached: XDP and tcx links, XDP attached through
    netlink (ip -j link), tc programs in clsact (tc -j filter) where iproute2 is installed."""
    where: dict[int, list[str]] = {}
    for link in objects.links():
        dev = _ifname(link.ifindex)
        if link.type == LinkType.XDP:
            where.setdefault(link.prog_id, []).append(f"{dev} (xdp link)")
        elif link.type in (LinkType.TCX, LinkType.NETKIT):
            side = "ingress" if link.attach_type == AttachType.TCX_INGRESS else "egress"
            kind = "tcx" if link.type == LinkType.TCX else "netkit"
            where.setdefault(link.prog_id, []).append(f"{dev} {side} ({kind})")
    for prog_id, text in _iproute2_attachments():
        if text not in where.get(prog_id, []):
            where.setdefault(prog_id, []).append(text)
    rows = []
    for desc in objects.programs():
        ks = kinds.for_program_type(desc.type)
        if not ks:
            continue
        word = ks[0].word
        name = _main_name(desc) or desc.name
        rows.append(ProgramRow(f"{word}/{name}", desc.id, name, ", ".join(where.get(desc.id, []))))
    return rows


def _ifname(ifindex: int) -> str:
    import socket
    try:
        return socket.if_indextoname(ifindex)
    except OSError:
        return f"ifindex {ifindex}"


def _iproute2_attachments() -> list[tuple[int, str]]:
    """(program id, where) of XDP programs attached through netlink and tc programs in clsact, from iproute2's JSON
    output (nothing when ip is not installed)."""
    if shutil.which("ip") is None:
        return []
    out = []
    links = _json(["ip", "-j", "-d", "link", "show"])
    for link in links:
        xdp = link.get("xdp") or {}
        progs = [a.get("prog", {}) for a in xdp.get("attached", [])] or [xdp.get("prog", {})]
        out += [(prog["id"], f"{link.get('ifname')} (xdp)") for prog in progs if prog.get("id")]
    if shutil.which("tc") is not None:
        for link in links:
            out += _clsact(link.get("ifname", ""))
    return out


def _clsact(dev: str) -> list[tuple[int, str]]:
    """(program id, where) of the tc programs in `dev`'s clsact qdisc."""
    out = []
    for side in ("ingress", "egress"):
        for f in _json(["tc", "-j", "filter", "show", "dev", dev, side]):
            prog_id = (f.get("options") or {}).get("prog", {}).get("id")
            if prog_id:
                out.append((prog_id, f"{dev} {side} (clsact)"))
    return out


def _json(argv: list[str]) -> list:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else []
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []
