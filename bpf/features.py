"""Cached probes of what this kernel accepts; each names what it needs and why it is missing."""

from __future__ import annotations

import errno
import os
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


def require(feature: str, fn: Callable[[], None]) -> None:
    err = probe(feature, fn)
    if err is not None:
        raise err


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


def raw_tracepoint_program() -> NotSupported | None:
    return probe("raw_tp programs", lambda: load(ProgType.RAW_TRACEPOINT, _ret0(), name="probe",
                                                 what="probe raw_tp").close())


def kprobe_program() -> NotSupported | None:
    def fn():
        if kprobe_pmu_type() is None:
            raise NotSupported("kprobe", "this kernel has no kprobes (CONFIG_KPROBES is off)")
        load(ProgType.KPROBE, _ret0(), name="probe", what="probe kprobe").close()
    return probe("kprobe", fn)


def map_type(kind: MapType, key: int = 4, value: int = 4, entries: int = 1) -> NotSupported | None:
    size = os.sysconf("SC_PAGE_SIZE") if kind == MapType.RINGBUF else entries
    k, v = (0, 0) if kind == MapType.RINGBUF else (key, value)
    return probe(f"{kind.name.lower()} maps", lambda: Map(kind, k, v, size, name="probe").close())


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


def clear_cache() -> None:
    _cache.clear()
