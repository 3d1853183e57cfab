"""What this kernel lets the program at one capture point do, tried for real once per kind of point (bpf.probes
caches each answer): read frags through skb dynptrs, load through skb->head, call bpf_get_current_task_btf."""

from __future__ import annotations

import contextlib

from bpf import asm, probes
from bpf.btf import BTF
from bpf.errors import BPFError
from bpf.maps import ArrayMap
from bpf.prog import load
from bpf.sys import btf_fd_by_name
from bpf.uapi import Helper, ProgType

from fcap.points.spec import Point


def dynptr_kfunc(point: Point) -> int:
    """BTF id of bpf_dynptr_from_skb when this kernel lets tracing programs read frags through it."""
    if point.copies_bytes or point.kind.on_program:   # (a program's exit verdict: records through the perf buffer)
        return 0
    f = BTF.vmlinux().find("bpf_dynptr_from_skb", "func")
    if f is None:
        return 0

    def fn():
        items = [asm.ldx(asm.DW, asm.R1, asm.R1, 8 * point.skb_index), asm.movi(asm.R2, 0),
                 asm.mov(asm.R3, asm.FP), asm.addi(asm.R3, -16),
                 asm.kfunc_call(f.id), asm.movi(asm.R0, 0), asm.exit_()]
        load(ProgType.TRACING, items, name="probe", expected_attach_type=point.kind.attach_type,
             attach_btf_id=point.btf_id, what="probe skb dynptr").close()
    return f.id if probes.probe(f"skb dynptr in {point.kind}", fn) is None else 0


def head_loads(point: Point) -> bool:
    """Whether the point's program may load packet bytes straight through skb->head (the verifier types it as
    untrusted read-only memory, its loads checked by the JIT; newer kernels), so the filter reads in place. Decided
    by loading the shape the filter then has: one path reads a byte through skb->head, the other a byte of a map
    value (the copy), each through a load instruction of its own, and the paths meet after the loads."""
    if not point.typed or not point.kind.on_skb:
        return False

    def fn():
        vm = point.btf.root
        skb = vm.find("sk_buff", "struct")
        mac, head = skb.member("mac_header")[1] // 8, skb.member("head")[1] // 8
        with ArrayMap(64, 1, name="fcap_probe") as copy:
            items = [asm.ldx(asm.DW, asm.R6, asm.R1, 8 * point.skb_index), asm.jmp(asm.JEQ, asm.R6, 0, "out"),
                     asm.st(asm.W, asm.FP, -8, 0), asm.ld_map_fd(asm.R1, copy.fileno()), asm.mov(asm.R2, asm.FP),
                     asm.addi(asm.R2, -8), asm.call(Helper.map_lookup_elem), asm.jmp(asm.JEQ, asm.R0, 0, "out"),
                     asm.ldx(asm.H, asm.R2, asm.R6, mac), asm.jmp(asm.JEQ, asm.R2, 0xFFFF, "copy"),
                     asm.ldx(asm.DW, asm.R1, asm.R6, head), asm.holds(asm.R1, "mem_untrusted"),
                     asm.alu64(asm.ADD, asm.R1, asm.R2, reg=True), asm.ldx(asm.B, asm.R0, asm.R1, 12), asm.ja("met"),
                     asm.label("copy"), asm.ldx(asm.B, asm.R0, asm.R0, 12),
                     asm.label("met"), asm.andi(asm.R0, 1), asm.exit_(),
                     asm.label("out"), asm.movi(asm.R0, 0), asm.exit_()]
            with btf_obj_fd(point) as obj_fd:
                load(ProgType.TRACING, items, name="probe", expected_attach_type=point.kind.attach_type,
                     attach_btf_id=point.btf_id, attach_btf_obj_fd=obj_fd,
                     what="probe loads through skb->head beside a copy's").close()
    return probes.probe(f"loads through skb->head in {point.kind}", fn) is None


def task_btf(point: Point) -> bool:
    """Whether the point's program may call bpf_get_current_task_btf (5.11+) for pid/tid and comm."""
    if not point.typed:
        return False
    try:
        with btf_obj_fd(point) as obj_fd:
            return probes.helper(Helper.get_current_task_btf, ProgType.TRACING, point.kind.attach_type,
                                   point.btf_id, obj_fd, label=f"{point.kind} programs") is None
    except BPFError:
        return False


@contextlib.contextmanager
def btf_obj_fd(point: Point):
    """The fd of the module BTF object `point` lives in, for a load's attach_btf_obj_fd (0 for vmlinux); at a BPF
    program, that program's fd (the union's attach_prog_fd)."""
    if point.target is not None:
        yield point.target.fd
        return
    if point.btf.base is None:
        yield 0
        return
    fd = btf_fd_by_name(point.module)
    try:
        yield fd.fd
    finally:
        fd.close()
