"""The one ctypes module: bpf() and perf_event_open() syscalls, attr structures, file descriptors that close."""

from __future__ import annotations

import ctypes
import errno
import os

from .errors import SyscallError
from .uapi import STATS_RUN_TIME, SYS_BPF, SYS_PERF_EVENT_OPEN, Cmd

# the process's own symbols (libc's syscall among them): ctypes.util.find_library would run ldconfig (~60 ms)
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long

u8, u16, u32, u64, s32 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32


class MapCreateAttr(ctypes.Structure):
    _fields_ = [("map_type", u32), ("key_size", u32), ("value_size", u32), ("max_entries", u32),
                ("map_flags", u32), ("inner_map_fd", u32), ("numa_node", u32), ("map_name", ctypes.c_char * 16),
                ("map_ifindex", u32), ("btf_fd", u32), ("btf_key_type_id", u32), ("btf_value_type_id", u32),
                ("btf_vmlinux_value_type_id", u32), ("_pad", u32), ("map_extra", u64)]


class MapElemAttr(ctypes.Structure):
    _fields_ = [("map_fd", u32), ("_pad", u32), ("key", u64), ("value", u64), ("flags", u64)]


class MapBatchAttr(ctypes.Structure):
    """BPF_MAP_LOOKUP_BATCH (5.6): from the position in_batch holds (NULL: the start), up to count keys and values;
    out_batch gets where to go on, count how many came."""
    _fields_ = [("in_batch", u64), ("out_batch", u64), ("keys", u64), ("values", u64), ("count", u32),
                ("map_fd", u32), ("elem_flags", u64), ("flags", u64)]


class ProgLoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", u32), ("insn_cnt", u32), ("insns", u64), ("license", u64),
                ("log_level", u32), ("log_size", u32), ("log_buf", u64), ("kern_version", u32),
                ("prog_flags", u32), ("prog_name", ctypes.c_char * 16), ("prog_ifindex", u32),
                ("expected_attach_type", u32), ("prog_btf_fd", u32), ("func_info_rec_size", u32),
                ("func_info", u64), ("func_info_cnt", u32), ("line_info_rec_size", u32), ("line_info", u64),
                ("line_info_cnt", u32), ("attach_btf_id", u32), ("attach_btf_obj_fd", u32),
                ("core_relo_cnt", u32), ("fd_array", u64), ("core_relos", u64), ("core_relo_rec_size", u32),
                ("log_true_size", u32)]


class TestRunAttr(ctypes.Structure):
    _fields_ = [("prog_fd", u32), ("retval", u32), ("data_size_in", u32), ("data_size_out", u32),
                ("data_in", u64), ("data_out", u64), ("repeat", u32), ("duration", u32),
                ("ctx_size_in", u32), ("ctx_size_out", u32), ("ctx_in", u64), ("ctx_out", u64),
                ("flags", u32), ("cpu", u32), ("batch_size", u32), ("_pad", u32)]


class RawTracepointAttr(ctypes.Structure):
    _fields_ = [("name", u64), ("prog_fd", u32), ("_pad", u32), ("cookie", u64)]


class LinkCreateAttr(ctypes.Structure):
    _fields_ = [("prog_fd", u32), ("target_fd", u32), ("attach_type", u32), ("flags", u32),
                ("target_btf_id", u32), ("_pad", u32), ("cookie", u64), ("_rest", u64 * 4)]


class KprobeMultiAttr(ctypes.Structure):
    """BPF_LINK_CREATE for BPF_TRACE_KPROBE_MULTI: link_create's kprobe_multi arm (5.18)."""
    _fields_ = [("prog_fd", u32), ("target_fd", u32), ("attach_type", u32), ("flags", u32),
                ("kprobe_flags", u32), ("cnt", u32), ("syms", u64), ("addrs", u64), ("cookies", u64)]


class TracingMultiAttr(ctypes.Structure):
    """BPF_LINK_CREATE for BPF_TRACE_FENTRY_MULTI / FEXIT_MULTI: link_create's tracing_multi arm (u32 BTF ids,
    u64 cookies, their count), as the kernels that have it lay it out (read from Debian 7.2's BTF)."""
    _fields_ = [("prog_fd", u32), ("target_fd", u32), ("attach_type", u32), ("flags", u32),
                ("ids", u64), ("cookies", u64), ("cnt", u32), ("_pad", u32)]


class InfoByFdAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", u32), ("info_len", u32), ("info", u64)]


class GetIdAttr(ctypes.Structure):
    _fields_ = [("start_id", u32), ("next_id", u32), ("open_flags", u32), ("fd_by_id_token_fd", u32)]


class EnableStatsAttr(ctypes.Structure):
    _fields_ = [("type", u32)]


class ProgInfo(ctypes.Structure):
    _fields_ = [("type", u32), ("id", u32), ("tag", u8 * 8), ("jited_prog_len", u32), ("xlated_prog_len", u32),
                ("jited_prog_insns", u64), ("xlated_prog_insns", u64), ("load_time", u64),
                ("created_by_uid", u32), ("nr_map_ids", u32), ("map_ids", u64), ("name", ctypes.c_char * 16),
                ("ifindex", u32), ("gpl_compatible", u32), ("netns_dev", u64), ("netns_ino", u64),
                ("nr_jited_ksyms", u32), ("nr_jited_func_lens", u32), ("jited_ksyms", u64),
                ("jited_func_lens", u64), ("btf_id", u32), ("func_info_rec_size", u32), ("func_info", u64),
                ("nr_func_info", u32), ("nr_line_info", u32), ("line_info", u64), ("jited_line_info", u64),
                ("nr_jited_line_info", u32), ("line_info_rec_size", u32), ("jited_line_info_rec_size", u32),
                ("nr_prog_tags", u32), ("prog_tags", u64), ("run_time_ns", u64), ("run_cnt", u64),
                ("recursion_misses", u64), ("verified_insns", u32), ("attach_btf_obj_id", u32),
                ("attach_btf_id", u32), ("_pad", u32)]


class BtfInfo(ctypes.Structure):
    _fields_ = [("btf", u64), ("btf_size", u32), ("id", u32), ("name", u64), ("name_len", u32),
                ("kernel_btf", u32)]


class PerfEventAttr(ctypes.Structure):
    _fields_ = [("type", u32), ("size", u32), ("config", u64), ("sample_period", u64), ("sample_type", u64),
                ("read_format", u64), ("flags", u64), ("wakeup", u32), ("bp_type", u32), ("config1", u64),
                ("config2", u64), ("branch_sample_type", u64), ("sample_regs_user", u64),
                ("sample_stack_user", u32), ("clockid", s32), ("sample_regs_intr", u64), ("aux_watermark", u32),
                ("sample_max_stack", u16), ("_reserved2", u16)]


CLONE_NEWNET = 0x40000000


def setns(fd: int, nstype: int) -> None:
    """Move this thread into the namespace the descriptor `fd` refers to (os.setns, before Python 3.12)."""
    if _libc.setns(fd, nstype) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def addr(obj) -> int:
    """Address of a ctypes object or buffer, as the u64 the kernel wants."""
    return ctypes.addressof(obj) if obj is not None else 0


def bpf(cmd: Cmd, attr: ctypes.Structure, op: str) -> int:
    """Call bpf(cmd, &attr, sizeof attr); raise SyscallError(op, errno) on failure."""
    ret = _syscall(SYS_BPF, ctypes.c_int(int(cmd)), ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
    if ret < 0:
        raise SyscallError(op, ctypes.get_errno())
    return ret


def bpf_errno(cmd: Cmd, attr: ctypes.Structure) -> tuple[int, int]:
    """Call bpf() and return (ret, errno) without raising (for callers that inspect the errno)."""
    ret = _syscall(SYS_BPF, ctypes.c_int(int(cmd)), ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
    return ret, (ctypes.get_errno() if ret < 0 else 0)


def perf_event_open(attr: PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int, op: str) -> int:
    attr.size = ctypes.sizeof(attr)
    ret = _syscall(SYS_PERF_EVENT_OPEN, ctypes.byref(attr), ctypes.c_int(pid), ctypes.c_int(cpu),
                   ctypes.c_int(group_fd), ctypes.c_ulong(flags))
    if ret < 0:
        raise SyscallError(op, ctypes.get_errno())
    return ret


class FD:
    """An owned file descriptor: closed by close(), by `with`, or when collected."""

    __slots__ = ("fd", "__weakref__")

    def __init__(self, fd: int):
        self.fd = fd

    def fileno(self) -> int:
        if self.fd < 0:
            raise ValueError("file descriptor is closed")
        return self.fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except OSError:
            pass

    def __int__(self) -> int:
        return self.fileno()

    def __repr__(self) -> str:
        return f"FD({self.fd})"


class FDOwner:
    """Base of an object that owns one FD, `self.fd`: its fileno(), and close() (also by `with`) closes it."""

    fd: FD

    def fileno(self) -> int:
        return self.fd.fileno()

    def close(self) -> None:
        self.fd.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def obj_info(fd: int, info: ctypes.Structure, op: str) -> ctypes.Structure:
    attr = InfoByFdAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=addr(info))
    bpf(Cmd.OBJ_GET_INFO_BY_FD, attr, op)
    return info


def enable_stats(kind: int = STATS_RUN_TIME) -> FD:
    """BPF_ENABLE_STATS: run-time stats on while the returned fd is open."""
    return FD(bpf(Cmd.ENABLE_STATS, EnableStatsAttr(type=kind), "enable BPF run-time stats"))


def kernel_btf_objects() -> list[tuple[int, str]]:
    """(btf object id, name) of every BTF object the kernel holds (vmlinux and modules)."""
    out: list[tuple[int, str]] = []
    start = 0
    while True:
        attr = GetIdAttr(start_id=start)
        ret, err = bpf_errno(Cmd.BTF_GET_NEXT_ID, attr)
        if ret < 0:
            if err == errno.ENOENT:  # the end
                return out
            raise SyscallError("list BTF objects", err)
        start = attr.next_id
        try:
            fd = FD(bpf(Cmd.BTF_GET_FD_BY_ID, GetIdAttr(start_id=start), f"open BTF object {start}"))
        except SyscallError:
            continue
        with fd:
            name = ctypes.create_string_buffer(64)
            info = BtfInfo(name=addr(name), name_len=64)
            obj_info(fd.fd, info, f"read info of BTF object {start}")
            out.append((start, name.value.decode()))


def btf_fd_by_name(name: str) -> FD:
    """Open the kernel's BTF object called `name` ('vmlinux' or a module), for attach_btf_obj_fd."""
    for obj_id, obj_name in kernel_btf_objects():
        if obj_name == name:
            return FD(bpf(Cmd.BTF_GET_FD_BY_ID, GetIdAttr(start_id=obj_id), f"open BTF of {name}"))
    raise SyscallError(f"find kernel BTF object {name!r}", errno.ENOENT)
