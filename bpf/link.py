"""Attaching programs: tp_btf/fentry/fexit/raw_tp through raw_tracepoint_open, kprobes through perf events."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os

from .errors import SyscallError
from .sys import FD, LinkCreateAttr, PerfEventAttr, RawTracepointAttr, addr, bpf, bpf_errno, perf_event_open
from .uapi import PERF_FLAG_FD_CLOEXEC, AttachType, Cmd, PerfIoctl

KPROBE_PMU = "/sys/bus/event_source/devices/kprobe"


class Link:
    """An attachment; detached when closed (all its fds closed)."""

    def __init__(self, fds: list[FD], what: str):
        self.fds = fds
        self.what = what

    def close(self) -> None:
        for fd in self.fds:
            fd.close()

    @property
    def closed(self) -> bool:
        return all(fd.closed for fd in self.fds)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Link({self.what})"


def attach_tracing(prog_fd: int, what: str) -> Link:
    """Attach a BTF-typed tracing program (tp_btf, fentry, fexit): its target was fixed at load time."""
    attr = RawTracepointAttr(name=0, prog_fd=prog_fd)
    return Link([FD(bpf(Cmd.RAW_TRACEPOINT_OPEN, attr, f"attach {what}"))], what)


def attach_raw_tracepoint(prog_fd: int, name: str) -> Link:
    """Attach a BPF_PROG_TYPE_RAW_TRACEPOINT program to the tracepoint `name` (e.g. "net_dev_queue")."""
    buf = ctypes.create_string_buffer(name.encode())
    attr = RawTracepointAttr(name=addr(buf), prog_fd=prog_fd)
    return Link([FD(bpf(Cmd.RAW_TRACEPOINT_OPEN, attr, f"attach raw_tp/{name}"))], f"raw_tp/{name}")


def kprobe_pmu_type() -> int | None:
    try:
        return int(open(os.path.join(KPROBE_PMU, "type")).read())
    except (OSError, ValueError):
        return None


def attach_kprobe(prog_fd: int, func: str, retprobe: bool = False) -> Link:
    """Create a kprobe (or kretprobe) perf event on `func` and run the program on it."""
    what = f"{'kretprobe' if retprobe else 'kprobe'}/{func}"
    pmu = kprobe_pmu_type()
    if pmu is None:
        raise SyscallError(f"attach {what}", errno.ENOENT, "this kernel has no kprobe PMU (CONFIG_KPROBES off)")
    name = ctypes.create_string_buffer(func.encode())
    attr = PerfEventAttr(type=pmu, config=1 if retprobe else 0, config1=addr(name), config2=0, sample_period=1)
    pfd = FD(perf_event_open(attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC, f"create {what}"))
    try:
        lattr = LinkCreateAttr(prog_fd=prog_fd, target_fd=pfd.fd, attach_type=AttachType.PERF_EVENT)
        ret, err = bpf_errno(Cmd.LINK_CREATE, lattr)
        if ret >= 0:
            return Link([FD(ret), pfd], what)
        try:  # kernels before 5.15: the ioctl way
            fcntl.ioctl(pfd.fd, PerfIoctl.SET_BPF, prog_fd)
            fcntl.ioctl(pfd.fd, PerfIoctl.ENABLE, 0)
        except OSError as e:
            raise SyscallError(f"attach {what}", e.errno or err) from None
        return Link([pfd], what)
    except BaseException:
        pfd.close()
        raise
