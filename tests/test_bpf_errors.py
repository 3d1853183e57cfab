"""bpf/'s errors: one root (bpf.BPFError), errno kept as data, the stdlib bases existing handlers rely on."""

import errno
import signal
import time

import pytest

import bpf
from bpf import asm, probes
from bpf import prog as prog_module
from bpf.btf import BTF
from bpf.cbpf import CBPFError
from bpf.errors import AsmError, BPFError, BTFError, NotSupported, PointerKindError, SyscallError, VerifierError
from bpf.uapi import AttachType, ProgType


def test_one_root():
    assert bpf.BPFError is BPFError
    for cls in (SyscallError, VerifierError, NotSupported, BTFError, AsmError, CBPFError, PointerKindError):
        assert issubclass(cls, BPFError)
    assert issubclass(SyscallError, OSError) and issubclass(VerifierError, SyscallError)
    assert issubclass(AsmError, ValueError) and issubclass(CBPFError, ValueError)


def test_errno_is_data():
    e = SyscallError("load program x", errno.EPERM)
    assert e.errno == errno.EPERM and e.errname == "EPERM" and e.op == "load program x"
    assert str(e) == "load program x: Operation not permitted (EPERM)"
    assert str(SyscallError("attach kprobe/f", errno.ENOENT, "no PMU")).endswith("(ENOENT): no PMU")
    v = VerifierError("load p", errno.EACCES, "0: (b7) r0 = 0\nR1 invalid mem access\nprocessed 2 insns\n")
    assert v.errno == errno.EACCES and v.detail == "R1 invalid mem access" and "processed" in v.log
    # 7.3's log explains itself in sections (Debian experimental's 7.3-rc7, a cgroup read at an XDP program's entry)
    sections = ("Verification failed: Register Type Safety: Invalid dereference\n\nReason:\n  R9 is an integer "
                "scalar here, not a pointer to memory.\n\nAt:\n  insn 33\n\nSuggestion:\n  Preserve a pointer-"
                "valued register where needed, or reload and revalidate the pointer after scalar\n  arithmetic, "
                "helper calls, or other operations that can invalidate it.\n\nprocessed 572 insns (limit 1000000)\n")
    v = VerifierError("load p", errno.EACCES, sections)
    assert v.detail == "R9 is an integer scalar here, not a pointer to memory."
    n = NotSupported("fentry programs", "the kernel refuses them (EPERM)", errno.EPERM)
    assert n.errno == errno.EPERM and n.feature == "fentry programs" and "refuses" in n.reason
    assert NotSupported("kprobe", "no kprobes").errno is None
    assert BTFError("parse x", "truncated").errno is None and str(BTFError("parse x", "truncated")) == \
        "parse x: truncated"
    with pytest.raises(BTFError, match="read /nonexistent") as raised:
        BTF.load_file("/nonexistent/btf")
    assert raised.value.errno == errno.ENOENT
    assert AsmError("bad").errno is None and CBPFError("bad", 3).index == 3


def test_a_refused_probe_keeps_the_errno():
    """features turns a refused load into NotSupported with the call's errno (here fentry: EPERM on this host)."""
    f = BTF.vmlinux().find("ip_output", "func")
    if f is None:
        pytest.skip("ip_output is not in this kernel's BTF")
    err = probes.tracing_program(AttachType.TRACE_FENTRY, f.id, label="fentry programs")
    if err is None:
        pytest.skip("this kernel loads fentry programs")
    assert isinstance(err, NotSupported) and isinstance(err.errno, int)
    assert errno.errorcode[err.errno] in err.reason   # the text says it too, but the errno is what callers test


def test_a_load_a_signal_cuts_short_is_tried_again(monkeypatch):
    """The verifier gives up with EAGAIN when a signal is pending for the loading thread (a child's SIGCHLD, a
    profiler's ptrace stop): prog.load tries again, as libbpf does, rather than report a rejection. A real SIGALRM
    is timed to arrive halfway through each of the first two verifications of a long program."""
    insns = [asm.movi(0, 0)] + [asm.addi(0, 1)] * 100_000 + [asm.exit_()]
    calls, timer = [], []
    real = prog_module.bpf_errno

    def watched(cmd, attr):
        if timer:
            signal.setitimer(signal.ITIMER_REAL, timer.pop())
        t = time.perf_counter()
        fd, err = real(cmd, attr)
        calls.append((err if fd < 0 else 0, time.perf_counter() - t))
        return fd, err

    monkeypatch.setattr(prog_module, "bpf_errno", watched)
    old = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        for _ in range(3):   # (a verification's time, the least of a few: the first, cold, takes longer)
            prog_module.load(ProgType.SOCKET_FILTER, insns, check_kinds=False)
        once = min(t for _, t in calls)
        for _ in range(5):   # (the signal must land inside the call: tried until it does)
            calls.clear()
            timer[:] = [once / 2, once / 2]
            p = prog_module.load(ProgType.SOCKET_FILTER, insns, check_kinds=False)
            assert p.fd.fileno() >= 0 and calls[-1][0] == 0
            if [err for err, _ in calls[:2]] == [errno.EAGAIN] * 2:
                break
            once = min(once, calls[-1][1])
        else:
            pytest.fail(f"no signal landed inside a verification of {once * 1e3:.1f} ms: {calls}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
