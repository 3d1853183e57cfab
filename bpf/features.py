"""Cached probes of what this kernel accepts; each names what it needs and why it is missing."""

from __future__ import annotations

import errno
from typing import Callable

from . import asm
from .errors import NotSupported, SyscallError
from .link import kprobe_pmu_type
from .maps import Map
from .prog import load
from .uapi import AttachType, MapType, ProgType

_cache: dict[str, NotSupported | None] = {}


def probe(feature: str, fn: Callable[[], None]) -> NotSupported | None:
    """Run fn once per process: None if it worked, else the NotSupported it raised, or one made of the
    SyscallError it raised (keeping its errno)."""
    if feature not in _cache:
        try:
            fn()
            _cache[feature] = None
        except NotSupported as e:
            _cache[feature] = e
        except SyscallError as e:
            _cache[feature] = NotSupported(feature, _explain(e), e.errno)
    return _cache[feature]


def _explain(e: SyscallError) -> str:
    if e.errno == errno.EPERM:
        return "the kernel refuses them (EPERM)"
    if e.errno == errno.EINVAL:
        return "the kernel does not know them (EINVAL)"
    return f"{e.op} failed: {e.errname}"


def _ret0() -> list:
    return [asm.movi(asm.R0, 0), asm.exit_()]


def tracing_program(attach: AttachType, btf_id: int, btf_obj_fd: int = 0, label: str = "") -> NotSupported | None:
    """Can a BPF_PROG_TYPE_TRACING program of this attach type load against BTF type `btf_id`?"""
    what = label or f"{attach.name.lower()} programs"

    def fn():
        load(ProgType.TRACING, _ret0(), name="probe", expected_attach_type=attach, attach_btf_id=btf_id,
             attach_btf_obj_fd=btf_obj_fd, what=f"probe {what}").close()
    return probe(f"{what}", fn)


def kprobe_program() -> NotSupported | None:
    def fn():
        if kprobe_pmu_type() is None:
            raise NotSupported("kprobe", "this kernel has no kprobes (CONFIG_KPROBES is off)")
        load(ProgType.KPROBE, _ret0(), name="probe", what="probe kprobe").close()
    return probe("kprobe", fn)


def bpf_syscall() -> NotSupported | None:
    """Is bpf() usable at all by this process (root or CAP_BPF + CAP_PERFMON)?"""
    def fn():
        try:
            Map(MapType.ARRAY, 4, 4, 1, name="probe").close()
        except SyscallError as e:
            if e.errno == errno.EPERM:
                raise NotSupported("bpf()", "operation not permitted: run as root (or with CAP_BPF and CAP_PERFMON)",
                                   e.errno) from None
            if e.errno == errno.ENOSYS:
                raise NotSupported("bpf()", "this kernel has no bpf() system call (CONFIG_BPF_SYSCALL off)",
                                   e.errno) from None
            raise
    return probe("bpf()", fn)

