"""The cgroup of each packet, in the capture program: the cgroup of the skb's socket (sk->sk_cgrp_data, as the
kernel's sock_cgroup_ptr reads it) or, where there is none, of the current task (its css_set's dfl_cgrp); its id
(the cgroup2 directory's inode number, kernfs_node.id) into META's cgroup with --context, and the --cgroup predicate
(that cgroup or one under it: its ancestor at the target's level). Member paths from BTF: 5.10's sock_cgroup_data
is a u64 `val` (low bits set: net_cls/net_prio data, the root cgroup), later ones a `cgroup` pointer; 5.10's cgroup
has ancestor_ids[], later ones ancestors[]. User space names the ids (fcap.host.ctxnames)."""

from __future__ import annotations

import re
from functools import lru_cache

from bpf.asm import (AND, B, DW, FP, JEQ, JNE, JSLT, R0, R1, R2, R3, R6, R7, R8, R9, W, addi, alu64, call, ja, jmp,
                     label, ld_imm64, ldx, mov, movi, st)
from bpf.btf import BTF, BTFError
from bpf.uapi import Helper

from fcap.errors import PredicateError
from fcap.kernel.parts import RECORD_META, Part, has_skb
from fcap.kernel.layout import META, STACK

ROOT_ID = 1                       # the cgroup2 root's id (its inode number)
TCP_TIME_WAIT, TCP_NEW_SYN_RECV = 6, 12   # skb->sk is no full socket (no sk_cgrp_data): sk_fullsock()


class Offsets:
    """Where the structures the cgroup is read through hold their members, from this kernel's BTF."""

    def __init__(self, vm: BTF):
        def at(struct: str, path: str) -> int:
            t = vm.find(struct, "struct")
            if t is None:
                raise BTFError(f"struct {struct}", "not in this kernel's BTF")
            return (t.member_path(path) if "." in path else t.member(path))[1] // 8

        self.sk = at("sk_buff", "sk")
        self.state = at("sock", "__sk_common.skc_state")
        skcd = at("sock", "sk_cgrp_data")
        try:   # 5.15+: a pointer
            self.skcd_ptr, self.skcd_val = skcd + at("sock_cgroup_data", "cgroup"), None
        except BTFError:   # 5.10: a u64 with flag bits
            self.skcd_ptr, self.skcd_val = None, skcd + at("sock_cgroup_data", "val")
        self.kn, self.level, self.kn_id = at("cgroup", "kn"), at("cgroup", "level"), at("kernfs_node", "id")
        try:   # 6.0+: struct cgroup *ancestors[]
            self.ancestors, self.ancestor_ids = at("cgroup", "ancestors"), None
        except BTFError:   # before: u64 ancestor_ids[]
            self.ancestors, self.ancestor_ids = None, at("cgroup", "ancestor_ids")
        self.cgroups, self.dfl = at("task_struct", "cgroups"), at("css_set", "dfl_cgrp")


@lru_cache(maxsize=4)
def offsets(vm: BTF) -> Offsets:
    return Offsets(vm)


def _offsets(b) -> Offsets:
    vm = b.point.btf.root
    try:
        return offsets(vm)
    except BTFError as e:
        raise PredicateError(f"cgroups: this kernel's BTF lacks what the cgroup is read through ({e})") from None


def _direct(b, o: Offsets) -> bool:
    """Plain loads where the verifier types every pointer on the way (BTF points, the task from
    get_current_task_btf, a sock_cgroup_data pointer); else bpf_probe_read_kernel throughout."""
    return b.point.typed and b.options.task_btf and o.skcd_ptr is not None


def _probe(b, size: int, dst: int, base: int, off: int) -> None:
    """dst = *(size *)(base + off) through bpf_probe_read_kernel (base: R6-R9; dst any but R1-R3)."""
    n = {B: 1, W: 4, DW: 8}[size]
    b.emit(mov(R1, FP), addi(R1, STACK.tmp), movi(R2, n), mov(R3, base), addi(R3, off),
           st(DW, FP, STACK.tmp, 0), call(Helper.probe_read_kernel), ldx(size, dst, FP, STACK.tmp))


def has_root_jump(b) -> bool:
    """Whether cgroup_pointer() jumps to `root` (5.10's sock_cgroup_data), so that code must be there."""
    o = _offsets(b)
    return not _direct(b, o) and o.skcd_val is not None


def cgroup_pointer(b, have: str, root: str, none: str) -> None:
    """R9 = the packet's struct cgroup (jumps to `have`), or a jump to `root` (the root cgroup: 5.10's flagged
    sock_cgroup_data; only where has_root_jump()) or `none`. The socket's when skb->sk is a full socket with a
    cgroup, else the task's (at an XDP program, whose context is an xdp_buff: no socket, the task's)."""
    o = _offsets(b)
    task = b.fresh("cg_task")
    if b.point.kind.on_skb:
        _socket_cgroup(b, o, have, root, task)
    b.emit(label(task))
    if _direct(b, o):
        b.emit(call(Helper.get_current_task_btf), ldx(DW, R9, R0, o.cgroups), jmp(JEQ, R9, 0, none),
               ldx(DW, R9, R9, o.dfl), jmp(JEQ, R9, 0, none), ja(have))
        return
    b.emit(call(Helper.get_current_task), mov(R9, R0))
    _probe(b, DW, R9, R9, o.cgroups)
    b.emit(jmp(JEQ, R9, 0, none))
    _probe(b, DW, R9, R9, o.dfl)
    b.emit(jmp(JEQ, R9, 0, none), ja(have))


def _socket_cgroup(b, o: Offsets, have: str, root: str, task: str) -> None:
    """R9 = the cgroup of skb->sk, a full socket's (on to `have`; 5.10's flagged data: `root`); else on to `task`
    (jumped to, or the next instruction)."""
    if _direct(b, o):
        b.emit(ldx(DW, R9, R6, o.sk), jmp(JEQ, R9, 0, task), ldx(B, R0, R9, o.state),
               jmp(JEQ, R0, TCP_TIME_WAIT, task), jmp(JEQ, R0, TCP_NEW_SYN_RECV, task),
               ldx(DW, R9, R9, o.skcd_ptr), jmp(JNE, R9, 0, have))
        return
    if b.snap is not None:   # (an untyped program's copy of the skb's members)
        b.read(DW, R9, R6, o.sk)
    else:
        _probe(b, DW, R9, R6, o.sk)
    b.emit(jmp(JEQ, R9, 0, task))
    _probe(b, B, R0, R9, o.state)
    b.emit(jmp(JEQ, R0, TCP_TIME_WAIT, task), jmp(JEQ, R0, TCP_NEW_SYN_RECV, task))
    if o.skcd_ptr is not None:
        _probe(b, DW, R9, R9, o.skcd_ptr)
        b.emit(jmp(JNE, R9, 0, have))
    else:   # sock_cgroup_ptr(): flag bits (net_cls/net_prio data) mean the root; 0 means none was set
        _probe(b, DW, R9, R9, o.skcd_val)
        b.emit(jmp(JEQ, R9, 0, task), mov(R0, R9), alu64(AND, R0, 3), jmp(JNE, R0, 0, root), ja(have))


def _cgroup_id(b, o: Offsets, dst: int, none: str) -> None:
    """dst = the id of the struct cgroup in R9 (its kernfs node's id); no node: `none`."""
    if _direct(b, o):
        b.emit(ldx(DW, dst, R9, o.kn), jmp(JEQ, dst, 0, none), ldx(DW, dst, dst, o.kn_id))
        return
    _probe(b, DW, dst, R9, o.kn)
    b.emit(jmp(JEQ, dst, 0, none))
    _probe(b, DW, dst, dst, o.kn_id)


def emit_cgroup(b) -> None:
    """META's cgroup: the packet's cgroup id (0 where none was found)."""
    o = _offsets(b)
    have, root, none, done = (b.fresh(n) for n in ("cg_have", "cg_root", "cg_none", "cg_done"))
    cgroup_pointer(b, have, root, none)
    b.emit(label(have))
    _cgroup_id(b, o, R8, none)
    b.emit(ja(done), [label(root), movi(R8, ROOT_ID), ja(done)] if has_root_jump(b) else [],
           label(none), movi(R8, 0), label(done), META.store(R7, "cgroup", R8))


def under(cgroup_id: int, level: int):
    """The --cgroup predicate: packets whose cgroup is the one with this id, at this depth below the root (0: the
    root), or one under it: the packet's cgroup's ancestor at that level has the id."""
    def emit(b) -> list:
        o = _offsets(b)
        have, root, passed = (b.fresh(n) for n in ("cgp_have", "cgp_root", "cgp_pass"))
        cgroup_pointer(b, have, root, "out")
        if has_root_jump(b):
            b.emit(label(root), ja(passed if level == 0 else "out"))
        b.emit(label(have))
        if _direct(b, o):
            b.emit(ldx(W, R8, R9, o.level))
        else:
            _probe(b, W, R8, R9, o.level)
        b.emit(jmp(JSLT, R8, level, "out"))
        # ancestors[] lies past the struct's BTF size (a flexible array): the verifier refuses a plain load there
        if o.ancestors is not None:
            _probe(b, DW, R9, R9, o.ancestors + 8 * level)
            b.emit(jmp(JEQ, R9, 0, "out"))
            _probe(b, DW, R9, R9, o.kn)
            b.emit(jmp(JEQ, R9, 0, "out"))
            _probe(b, DW, R8, R9, o.kn_id)
        else:
            _probe(b, DW, R8, R9, o.ancestor_ids + 8 * level)
        b.emit(ld_imm64(R1, cgroup_id), jmp(JNE, R8, R1, "out", reg=True), label(passed))
        return []
    return emit


def _records_cgroup(point, options, maps) -> bool:
    return options.meta and options.context and has_skb(point)


CGROUP = Part("cgroup", on=_records_cgroup, stages={RECORD_META: emit_cgroup}, fields=("cgroup",),
                 reads="fcap.features.packet_context.ContextNames")


# --where's context terms: the --cgroup and --container predicates spelled as tests ('cgroup == /system.slice')
WHERE_TERM = re.compile(r"""^\s*(?P<what>cgroup|container)\s*==\s*(?P<q>["']?)(?P<value>.+?)(?P=q)\s*$""")


def where_term(text: str) -> tuple[str, str] | None:
    """('cgroup' or 'container', the value) of a --where test of the packet's context, else None."""
    m = WHERE_TERM.match(text)
    return (m.group("what"), m.group("value")) if m else None


def target_predicates(cgroup: str | None = None, container: str | None = None) -> list:
    """Factories (point -> predicate) of --cgroup PATH and --container NAME: under() of each target, found by
    walking the cgroup2 hierarchy now (fcap.host.ctxnames; PredicateError with one line when it is not there)."""
    if cgroup is None and container is None:
        return []
    from fcap.host import ctxnames
    names = ctxnames.CgroupNames()
    targets = ([names.target(cgroup)] if cgroup is not None else []) + \
        ([names.container(container)] if container is not None else [])
    return [lambda point, t=t: under(t[0], t[1]) for t in targets]

