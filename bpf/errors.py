"""Typed errors of the BPF toolkit, under one root (BPFError): each names the operation and the cause."""

from __future__ import annotations

import errno as _errno
import os


class BPFError(Exception):
    """Root of every error bpf/ raises. `errno` is the errno of the system call that failed, None if none did."""

    def __init__(self, *args: object, errno: int | None = None):
        super().__init__(*args)
        self.errno = errno


class SyscallError(BPFError, OSError):
    """A bpf()/perf_event_open() call failed: `op` is what was attempted, `errno` why (also an OSError)."""

    def __init__(self, op: str, err: int, detail: str = ""):
        OSError.__init__(self, err, os.strerror(err) if err else detail)
        self.op = op
        self.detail = detail

    @property
    def errname(self) -> str:
        return _errno.errorcode.get(self.errno, str(self.errno))

    def __str__(self) -> str:
        msg = f"{self.op}: {os.strerror(self.errno)} ({self.errname})" if self.errno else self.op
        return f"{msg}: {self.detail}" if self.detail else msg


class VerifierError(SyscallError):
    """The verifier rejected a program; `log` holds the whole verifier log, `detail` the line that says why."""

    def __init__(self, op: str, err: int, log: str):
        self.log = log
        lines = [ln for ln in log.strip().splitlines() if ln.strip()]
        tail = lines[-1] if lines else ""
        for ln in reversed(lines):  # the line that names the problem is usually just before the stats
            if not ln.startswith(("processed ", "verification time", "stack depth")):
                tail = ln
                break
        super().__init__(op, err, tail)


class NotSupported(BPFError):
    """This kernel lacks a feature: `feature` is what was probed, `reason` why it is not there, `errno` the
    refused call's errno (None when the probe needed no call to know)."""

    def __init__(self, feature: str, reason: str, errno: int | None = None):
        super().__init__(f"{feature} not supported: {reason}", errno=errno)
        self.feature = feature
        self.reason = reason


class BTFError(BPFError):
    """A BTF operation that failed: `op` says what was attempted, `cause` why (`errno` when a read failed)."""

    def __init__(self, op: str, cause: object, errno: int | None = None):
        super().__init__(op, cause, errno=errno)
        self.op, self.cause = op, cause

    def __str__(self) -> str:
        return f"{self.op}: {self.cause}"


class AsmError(BPFError, ValueError):
    """Bad instruction stream: unknown or duplicate label, jump out of range, truncated bytes."""


class CBPFError(BPFError, ValueError):
    """An invalid (or unsupported) cBPF program; `index` is the offending instruction, when there is one."""

    def __init__(self, msg: str, index: int | None = None):
        super().__init__(msg if index is None else f"cBPF instruction {index}: {msg}")
        self.index = index
