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
        super().__init__(op, err, reason(log))


def reason(log: str) -> str:
    """The line of a verifier log that says why: the line just before the stats; where the log explains itself in
    sections (7.3+: "Verification failed: ...", "Reason:", "At:", "Suggestion:"), the first line of its reason."""
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.strip() == "Reason:" and i + 1 < len(lines):
            return lines[i + 1].strip()
    for ln in reversed(lines):  # the line that names the problem is usually just before the stats
        if not ln.startswith(("processed ", "verification time", "stack depth")):
            return ln
    return lines[-1] if lines else ""


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


class PointerKindError(BPFError):
    """A generated program that some verifier refuses: a load or store reached with more than one kind of pointer
    in its base register (bpf.ptrkinds), or a program the check cannot follow. `insn` is the instruction's slot
    (as asm.disassemble numbers it), `label` the nearest label before it, `reg` the base register, `kinds` the
    pointer kinds it holds there (bpf.ptrkinds.Kind); `text` the instruction. Found before any system call."""

    def __init__(self, msg: str, insn: int | None = None, label: str | None = None, reg: int | None = None,
                 kinds: int = 0, text: str = ""):
        super().__init__(msg)
        self.insn, self.label, self.reg, self.kinds, self.text = insn, label, reg, kinds, text


class ElfError(BPFError):
    """An ELF file (bpf.elf) that cannot be read or is not one bpf.elf reads: `op` what was attempted, `cause` why
    (`errno` when a read failed)."""

    def __init__(self, op: str, cause: object, errno: int | None = None):
        super().__init__(op, cause, errno=errno)
        self.op, self.cause = op, cause

    def __str__(self) -> str:
        return f"{self.op}: {self.cause}"


class NoSymbol(ElfError):
    """An ELF file without the function `name` in its symbol tables (none there, or stripped): `path`, `name`."""

    def __init__(self, path: str, name: str):
        super().__init__(f"find {name} in {path}", "no such function in its symbol tables")
        self.path, self.name = path, name
