"""Typed errors of the BPF toolkit: each names the operation and the cause."""

import errno as _errno
import os


class BPFError(OSError):
    """A bpf()/perf_event_open() call failed: `op` is what was attempted, `errno` why."""

    def __init__(self, op: str, err: int, detail: str = ""):
        super().__init__(err, os.strerror(err) if err else detail)
        self.op = op
        self.detail = detail

    @property
    def errname(self) -> str:
        return _errno.errorcode.get(self.errno, str(self.errno))

    def __str__(self) -> str:
        msg = f"{self.op}: {os.strerror(self.errno)} ({self.errname})" if self.errno else self.op
        return f"{msg}: {self.detail}" if self.detail else msg


class VerifierError(BPFError):
    """The verifier rejected a program; `log` holds the whole verifier log."""

    def __init__(self, op: str, err: int, log: str):
        self.log = log
        lines = [ln for ln in log.strip().splitlines() if ln.strip()]
        tail = lines[-1] if lines else ""
        for ln in reversed(lines):  # the line that names the problem is usually just before the stats
            if not ln.startswith(("processed ", "verification time", "stack depth")):
                tail = ln
                break
        super().__init__(op, err, tail)


class NotSupported(Exception):
    """This kernel lacks a feature: `feature` is what was probed, `reason` why it is not there."""

    def __init__(self, feature: str, reason: str):
        super().__init__(f"{feature} not supported: {reason}")
        self.feature = feature
        self.reason = reason
