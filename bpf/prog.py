"""Program load (verifier log captured, grown on ENOSPC), test_run, and run-time stats."""

from __future__ import annotations

import ctypes
import errno
from typing import TYPE_CHECKING, Iterable, Mapping, NamedTuple, Sequence

from . import asm
from .errors import SyscallError, VerifierError
from .sys import FD, FDOwner, ProgInfo, ProgLoadAttr, TestRunAttr, addr, bpf, bpf_errno, obj_info
from .uapi import BPF_OBJ_NAME_LEN, AttachType, Cmd, ProgType

if TYPE_CHECKING:
    from .ptrkinds import Kind

LOG_START = 64 * 1024
LOG_MAX = 256 * 1024 * 1024 - 1  # the kernel's limit on log_size (u32 >> 2 before 5.2, UINT_MAX >> 8 after)
# The verifier stops with EAGAIN when a signal is pending for the loading thread (a child's SIGCHLD, a terminal's
# SIGWINCH, a profiler's ptrace stops): the load is tried again, as libbpf does, this many times in all
LOAD_ATTEMPTS = 32


class ProgStats(NamedTuple):
    run_time_ns: int
    run_cnt: int
    recursion_misses: int
    verified_insns: int


class Program(FDOwner):
    """A loaded program: its fd, the instructions it was made of, and the verifier's log when asked."""

    def __init__(self, fd: FD, name: str, insns: list[asm.Insn], log: str = ""):
        self.fd = fd
        self.name = name
        self.insns = insns
        self.log = log

    def info(self) -> ProgInfo:
        return obj_info(self.fd.fileno(), ProgInfo(), f"read info of program {self.name}")

    def stats(self) -> ProgStats:
        i = self.info()
        return ProgStats(i.run_time_ns, i.run_cnt, i.recursion_misses, i.verified_insns)

    def test_run(self, data: bytes = b"", ctx: bytes | None = None, repeat: int = 1,
                 data_out_size: int = 0) -> tuple[int, int, bytes]:
        """BPF_PROG_TEST_RUN: returns (retval, duration ns per run, data out)."""
        din = ctypes.create_string_buffer(bytes(data), max(len(data), 1))
        dout = ctypes.create_string_buffer(data_out_size) if data_out_size else None
        cin = ctypes.create_string_buffer(bytes(ctx), len(ctx)) if ctx else None
        attr = TestRunAttr(prog_fd=self.fd.fileno(), data_size_in=len(data), data_in=addr(din),
                           data_size_out=data_out_size, data_out=addr(dout), repeat=repeat,
                           ctx_size_in=len(ctx) if ctx else 0, ctx_in=addr(cin))
        bpf(Cmd.PROG_TEST_RUN, attr, f"test-run program {self.name}")
        out = dout.raw[: attr.data_size_out] if dout is not None else b""
        return attr.retval, attr.duration, out


def wait_freed(ids: list[int], timeout: float) -> bool:
    """Wait (sleeping) until the kernel has freed the programs with these ids, e.g. after their links were
    closed: a link's release may hand its program back only after an RCU grace period. True if all went."""
    import time
    from .sys import GetIdAttr
    deadline = time.monotonic() + timeout
    left = list(ids)
    while left:
        still = []
        for i in left:
            fd, err = bpf_errno(Cmd.PROG_GET_FD_BY_ID, GetIdAttr(start_id=i))
            if fd >= 0:
                FD(fd).close()
                still.append(i)
            elif err == errno.EPERM:   # (privileges dropped: nothing to ask the kernel with)
                return False
            elif err != errno.ENOENT:
                still.append(i)
        left = still
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.002)
    return not left


def load(prog_type: ProgType, insns: Iterable[asm.Item], *, name: str = "", license: str = "GPL",
         expected_attach_type: AttachType = AttachType.NONE, attach_btf_id: int = 0,
         attach_btf_obj_fd: int = 0, log_level: int = 0, what: str = "", btf_fd: int = 0,
         func_info: Sequence[tuple[int, int]] = (), prog_flags: int = 0, check_kinds: bool = True,
         kfuncs: Mapping[int, Kind] | None = None) -> Program:
    """Load a program. On rejection the verifier's log is captured (retried with a log, grown on ENOSPC) and raised
    as VerifierError; other refusals (EPERM, EINVAL without a log) as SyscallError. With `btf_fd` and `func_info`
    ((instruction, BTF FUNC id) pairs) the program carries its own BTF (bpf.btf_write); attach_btf_obj_fd is also
    the union's attach_prog_fd: the target of fentry/fexit on a BPF program. prog_flags: BPF_F_* load flags
    (bpf.uapi.ProgFlag), e.g. an XDP program that takes multi-buffer packets. Before any system call the program
    is checked for loads and stores that more than one kind of pointer reaches (bpf.ptrkinds: PointerKindError;
    kfuncs: what the kfuncs it calls return, for those that return pointers), unless check_kinds=False."""
    insns = list(insns)
    if check_kinds:
        from . import ptrkinds   # (when a program is loaded: not in the start-up of fcap -r)
        ptrkinds.check(insns, prog_type, kfuncs=kfuncs)
    resolved = asm.resolve(insns)
    code = b"".join(i.encode() for i in resolved)
    buf = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(license.encode())
    op = f"load program {what or name or prog_type.name}"
    finfo = (ctypes.c_uint32 * (2 * len(func_info)))(*(v for pair in func_info for v in pair)) if func_info else None

    def attempt(level: int, size: int):
        log = ctypes.create_string_buffer(size) if level else None
        attr = ProgLoadAttr(prog_type=prog_type, insn_cnt=len(code) // 8, insns=addr(buf), license=addr(lic),
                            log_level=level, log_size=size if level else 0, log_buf=addr(log),
                            prog_name=name.encode()[:BPF_OBJ_NAME_LEN - 1], expected_attach_type=expected_attach_type,
                            attach_btf_id=attach_btf_id, attach_btf_obj_fd=attach_btf_obj_fd, prog_btf_fd=btf_fd,
                            func_info_rec_size=8 if func_info else 0, func_info=addr(finfo),
                            func_info_cnt=len(func_info), prog_flags=prog_flags)
        for _ in range(LOAD_ATTEMPTS):
            fd, err = bpf_errno(Cmd.PROG_LOAD, attr)
            if fd >= 0 or err != errno.EAGAIN:
                break
        text = log.value.decode(errors="replace") if log is not None else ""
        return fd, err, text

    fd, err, text = attempt(log_level, LOG_START if log_level else 0)
    if fd >= 0:
        return Program(FD(fd), name, resolved, text)
    if err in (errno.EPERM, errno.EAGAIN):  # a policy refusal (a log would say nothing more), or never let finish
        raise SyscallError(op, err)
    size = LOG_START
    level = log_level or 1
    while True:
        fd, err2, text = attempt(level, size)
        if fd >= 0:  # accepted the second time (should not happen); keep it
            return Program(FD(fd), name, resolved, text)
        if err2 == errno.ENOSPC and size < LOG_MAX:
            size = min(size * 4, LOG_MAX)
            continue
        if text.strip() and err2 != errno.EAGAIN:
            raise VerifierError(op, err2 if err2 != errno.ENOSPC else err, text)
        raise SyscallError(op, err2 if err2 == errno.EAGAIN else err)
