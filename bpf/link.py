"""Attaching programs: tp_btf/fentry/fexit/raw_tp through raw_tracepoint_open, kprobes and uprobes through perf
events, one program on many functions through kprobe-multi and tracing-multi links (a cookie per function), XDP and
tcx programs on a device through links."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from typing import Sequence

from .errors import SyscallError
from .sys import (FD, KprobeMultiAttr, LinkCreateAttr, PerfEventAttr, RawTracepointAttr, TracingMultiAttr, addr, bpf,
                  bpf_errno, perf_event_open)
from .uapi import PERF_FLAG_FD_CLOEXEC, AttachType, Cmd, PerfIoctl

KPROBE_PMU = "/sys/bus/event_source/devices/kprobe"
UPROBE_PMU = "/sys/bus/event_source/devices/uprobe"


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
    return _pmu_type(KPROBE_PMU)


def _pmu_type(pmu: str) -> int | None:
    try:
        return int(open(os.path.join(pmu, "type")).read())
    except (OSError, ValueError):
        return None


def attach_kprobe(prog_fd: int, func: str, retprobe: bool = False) -> Link:
    """Create a kprobe (or kretprobe) perf event on `func` and run the program on it."""
    what = f"{'kretprobe' if retprobe else 'kprobe'}/{func}"
    return _attach_probe(prog_fd, KPROBE_PMU, "CONFIG_KPROBES", func, 0, retprobe, what)


def attach_uprobe(prog_fd: int, path: str, offset: int, retprobe: bool = False) -> Link:
    """Create a uprobe (or uretprobe) perf event at byte `offset` of the executable file `path` (bpf.elf finds a
    function's) and run the program on it, in every process that maps the file."""
    what = f"{'uretprobe' if retprobe else 'uprobe'}/{path}:{offset:#x}"
    return _attach_probe(prog_fd, UPROBE_PMU, "CONFIG_UPROBE_EVENTS", path, offset, retprobe, what)


def _attach_probe(prog_fd: int, pmu_dir: str, config: str, name: str, offset: int, retprobe: bool,
                  what: str) -> Link:
    """A kprobe or uprobe perf event (of the PMU in `pmu_dir`: config1 names the function or file, config2 is the
    offset in it; pid -1 and CPU 0: every process, the program running on every CPU) running the program: a
    perf_event link (5.15), else the ioctls."""
    pmu = _pmu_type(pmu_dir)
    if pmu is None:
        raise SyscallError(f"attach {what}", errno.ENOENT, f"this kernel has no {os.path.basename(pmu_dir)} PMU "
                                                           f"({config} off)")
    where = ctypes.create_string_buffer(name.encode())
    attr = PerfEventAttr(type=pmu, config=1 if retprobe else 0, config1=addr(where), config2=offset, sample_period=1)
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


def attach_kprobe_multi(prog_fd: int, symbols: Sequence[str], cookies: Sequence[int], what: str = "") -> Link:
    """One kprobe-multi link (BPF_TRACE_KPROBE_MULTI, 5.18) running the program at every kallsyms symbol in
    `symbols`, bpf_get_attach_cookie() giving the cookie at the same index. The kernel takes all or none: one symbol
    it cannot probe fails the whole link (its errno)."""
    if len(cookies) != len(symbols):
        raise ValueError("one cookie per symbol")
    # the kernel looks the symbols up in one pass over kallsyms (ftrace_lookup_symbols) and fails the link when they
    # are not in strcmp order: sorted here, each cookie kept with its symbol
    pairs = sorted(zip((s.encode() for s in symbols), cookies))
    symbols, cookies = [s for s, _c in pairs], [c for _s, c in pairs]
    names = [ctypes.create_string_buffer(s) for s in symbols]
    syms = (ctypes.c_uint64 * len(names))(*(addr(n) for n in names))
    cooks = (ctypes.c_uint64 * len(cookies))(*cookies)
    attr = KprobeMultiAttr(prog_fd=prog_fd, attach_type=AttachType.TRACE_KPROBE_MULTI, cnt=len(names),
                           syms=addr(syms), cookies=addr(cooks))
    what = what or f"kprobe-multi ({len(names)} functions)"
    return Link([FD(bpf(Cmd.LINK_CREATE, attr, f"attach {what}"))], what)


def attach_tracing_multi(prog_fd: int, attach_type: int, btf_ids: Sequence[int], cookies: Sequence[int],
                         what: str = "") -> Link:
    """One tracing-multi link (BPF_TRACE_FENTRY_MULTI / FEXIT_MULTI: `attach_type` as the kernel numbers it) running
    the program at every function in `btf_ids` (of the BTF object the program was loaded against), the cookie at
    the same index for each. All or none, as kprobe-multi."""
    if len(cookies) != len(btf_ids):
        raise ValueError("one cookie per function")
    pairs = sorted(zip(btf_ids, cookies))   # in ascending id order, each cookie kept with its function
    btf_ids, cookies = [i for i, _c in pairs], [c for _i, c in pairs]
    ids = (ctypes.c_uint32 * len(btf_ids))(*btf_ids)
    cooks = (ctypes.c_uint64 * len(cookies))(*cookies)
    attr = TracingMultiAttr(prog_fd=prog_fd, attach_type=attach_type, ids=addr(ids), cookies=addr(cooks),
                            cnt=len(btf_ids))
    what = what or f"tracing-multi ({len(btf_ids)} functions)"
    return Link([FD(bpf(Cmd.LINK_CREATE, attr, f"attach {what}"))], what)


def attach_device(prog_fd: int, ifindex: int, attach_type: int, what: str) -> Link:
    """A link running the program on device `ifindex` (of the caller's network namespace): AttachType.XDP (5.9),
    TCX_INGRESS / TCX_EGRESS (6.6)."""
    attr = LinkCreateAttr(prog_fd=prog_fd, target_fd=ifindex, attach_type=attach_type)
    return Link([FD(bpf(Cmd.LINK_CREATE, attr, f"attach {what}"))], what)
