"""Cached probes of what this kernel accepts; each names what it needs and why it is missing."""

from __future__ import annotations

import errno
import os
from typing import Callable

from . import asm
from .errors import NotSupported, SyscallError, VerifierError
from .link import kprobe_pmu_type
from .maps import Map
from .prog import load
from .uapi import AttachType, Capability, Helper, MapType, ProgType

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


PROBE_FUNCTION = "bpf_fentry_test1"   # the function the kernel keeps for BPF's own attach tests (net/bpf/test_run.c)


def attach_type(name: str) -> int:
    """The value this kernel gives enum bpf_attach_type's BPF_`name` (e.g. "TRACE_FENTRY_MULTI"), read from its BTF;
    -1 where its BTF has no such member."""
    from .btf import BTF, BTFError
    try:
        enum = BTF.vmlinux().find("bpf_attach_type", "enum")
    except (BTFError, OSError):
        enum = None
    if enum is None:
        return int(AttachType[name]) if name in AttachType.__members__ else -1
    return enum.values.get(f"BPF_{name}", -1)


def _cookie_program(get_arg: bool) -> list:
    """A program that reads its attach cookie (and, for tracing-multi, argument 0 through bpf_get_func_arg)."""
    insns = [asm.mov(asm.R6, asm.R1)]
    if get_arg:
        insns += [asm.st(asm.DW, asm.FP, -8, 0), asm.movi(asm.R2, 0), asm.mov(asm.R3, asm.FP), asm.addi(asm.R3, -8),
                  asm.call(Helper.get_func_arg)]
    return insns + [asm.mov(asm.R1, asm.R6), asm.call(Helper.get_attach_cookie), asm.movi(asm.R0, 0), asm.exit_()]


def kprobe_multi() -> NotSupported | None:
    """Can a kprobe program that reads its attach cookie run at many functions through one kprobe-multi link
    (BPF_TRACE_KPROBE_MULTI, Linux 5.18+)? Tried for real: loaded, and attached at PROBE_FUNCTION."""
    def fn():
        from .link import attach_kprobe_multi
        if kprobe_pmu_type() is None:
            raise NotSupported("kprobe-multi", "this kernel has no kprobes (CONFIG_KPROBES is off)")
        try:
            prog = load(ProgType.KPROBE, _cookie_program(False), name="probe",
                        expected_attach_type=AttachType.TRACE_KPROBE_MULTI, what="probe kprobe-multi")
        except VerifierError:
            raise NotSupported("kprobe-multi", "kprobe programs may not read an attach cookie on this kernel "
                                               "(bpf_get_attach_cookie: Linux 5.15+)") from None
        except SyscallError as e:
            raise NotSupported("kprobe-multi", f"the kernel refused a kprobe-multi program ({e.errname}; "
                                               "BPF_TRACE_KPROBE_MULTI: Linux 5.18+)", e.errno) from None
        with prog:
            try:
                attach_kprobe_multi(prog.fileno(), [PROBE_FUNCTION], [1]).close()
            except SyscallError as e:
                raise NotSupported("kprobe-multi", f"this kernel has no kprobe-multi links ({e.errname}; "
                                   "BPF_TRACE_KPROBE_MULTI, Linux 5.18+, CONFIG_FPROBE)", e.errno) from None
    return probe("kprobe-multi", fn)


def tracing_multi(name: str = "TRACE_FENTRY_MULTI") -> NotSupported | None:
    """Can one fentry (or fexit: `name` "TRACE_FEXIT_MULTI") program reading its attach cookie and its arguments
    (bpf_get_func_arg) run at many functions through one tracing-multi link? The attach type is read from the
    kernel's BTF (BPF_TRACE_FENTRY_MULTI, in Debian's 7.2 kernel); tried for real at PROBE_FUNCTION."""
    label = name.removeprefix("TRACE_").lower().replace("_", "-")

    def fn():
        from .btf import BTF
        from .link import attach_tracing_multi
        value = attach_type(name)
        if value < 0:
            raise NotSupported(label, f"this kernel has no tracing-multi links (BPF_{name} is not in its BTF; "
                                      f"Linux 7.2+, the first seen here)")
        func = BTF.vmlinux().find(PROBE_FUNCTION, "func")
        if func is None:
            raise NotSupported(label, f"this kernel has no {PROBE_FUNCTION} to try a tracing-multi link at")
        try:
            with load(ProgType.TRACING, _cookie_program(True), name="probe", expected_attach_type=value,
                      what=f"probe {label}") as prog:
                attach_tracing_multi(prog.fileno(), value, [func.id], [1]).close()
        except SyscallError as e:   # (VerifierError too)
            raise NotSupported(label, f"the kernel refused a {label} program or link ({e.errname}; "
                                      f"BPF_{name}: Linux 7.2+, the first seen here)", e.errno) from None
    return probe(label, fn)


def atomic_fetch() -> NotSupported | None:
    """Does the verifier take atomic operations that fetch (BPF_ATOMIC | BPF_FETCH: Linux 5.12+)? Before them only
    the old XADD (an add that returns nothing)."""
    def fn():
        insns = [asm.st(asm.DW, asm.FP, -8, 0), asm.movi(asm.R1, 1), asm.fetch_add(asm.DW, asm.FP, -8, asm.R1),
                 asm.movi(asm.R0, 0), asm.exit_()]
        try:
            load(ProgType.SOCKET_FILTER, insns, name="probe", what="probe atomic fetch").close()
        except VerifierError:
            raise NotSupported("atomic fetch", "the verifier takes no atomic operations that fetch (Linux 5.12+)") \
                from None
    return probe("atomic fetch", fn)


def store_release() -> NotSupported | None:
    """Does the verifier take store-release instructions (BPF_STORE_REL: Linux 6.15+)?"""
    def fn():
        insns = [asm.movi(asm.R1, 1), asm.store_release(asm.DW, asm.FP, -8, asm.R1), asm.movi(asm.R0, 0),
                 asm.exit_()]
        try:
            load(ProgType.SOCKET_FILTER, insns, name="probe", what="probe store-release").close()
        except VerifierError:
            raise NotSupported("store-release", "the verifier takes no store-release instructions (Linux 6.15+)") \
                from None
    return probe("store-release", fn)


def map_type(kind: MapType, key: int = 4, value: int = 4, entries: int = 1) -> NotSupported | None:
    """Can this kernel make a map of this type? (A ring buffer: one page, no key or value size.)"""
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
                why = privilege_problem() or "run as root (or with CAP_BPF and CAP_PERFMON)"
                raise NotSupported("bpf()", f"operation not permitted: {why}", e.errno) from None
            if e.errno == errno.ENOSYS:
                raise NotSupported("bpf()", "this kernel has no bpf() system call (CONFIG_BPF_SYSCALL off)",
                                   e.errno) from None
            raise
    return probe("bpf()", fn)


def privilege_problem() -> str | None:
    """What this process visibly lacks for BPF tracing, to explain an EPERM: its user namespace is not the initial
    one (capabilities there do not count for bpf()), or CAP_BPF / CAP_PERFMON (without CAP_SYS_ADMIN) are not in
    its effective set. None when neither shows a cause (then the kernel's own policy refused)."""
    if in_user_namespace():
        return ("this process is in a user namespace, whose capabilities do not count for BPF: run it as root "
                "in the initial user namespace")
    missing = missing_capabilities()
    if not missing:
        return None
    has = [f"CAP_{c.name}" for c in (Capability.BPF, Capability.PERFMON) if f"CAP_{c.name}" not in missing]
    return (f"this process lacks {' and '.join(missing)}{f' (it has {has[0]})' if has else ''}: run it as root or "
            "with CAP_BPF and CAP_PERFMON")


def missing_capabilities() -> list[str]:
    """CAP_BPF and CAP_PERFMON when not in this process's effective set (none with CAP_SYS_ADMIN)."""
    try:
        with open("/proc/self/status") as f:
            eff = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return []
    if eff >> Capability.SYS_ADMIN & 1:
        return []
    return [f"CAP_{c.name}" for c in (Capability.BPF, Capability.PERFMON) if not eff >> c & 1]


def in_user_namespace() -> bool:
    """Whether this process is in a user namespace other than the initial one (whose uid_map is the identity
    over every uid)."""
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


# ---- helpers: may a program of a given type (at a given attach point) call this helper? -------------------

# The first mainline kernel with each helper (by bpf.uapi.Helper name): only to name it in a refusal (the probe
# decides, never this table).
HELPER_SINCE = {
    "map_lookup_elem": "3.19", "ktime_get_ns": "4.1", "get_smp_processor_id": "4.1", "get_current_pid_tgid": "4.2",
    "get_current_comm": "4.2", "perf_event_output": "4.4", "get_current_task": "4.8", "skb_output": "5.5",
    "probe_read_kernel": "5.5", "ringbuf_output": "5.8", "ringbuf_reserve": "5.8", "ringbuf_submit": "5.8",
    "ktime_get_boot_ns": "5.8", "get_current_task_btf": "5.11", "get_attach_cookie": "5.15", "get_func_arg": "5.17",
    "get_func_ret": "5.17", "get_func_arg_cnt": "5.17", "dynptr_read": "5.19", "dynptr_write": "5.19",
    "dynptr_data": "5.19", "ktime_get_tai_ns": "6.1",
}


def helper(h: int, prog_type: ProgType = ProgType.RAW_TRACEPOINT, attach: AttachType = AttachType.NONE,
           btf_id: int = 0, btf_obj_fd: int = 0, label: str = "") -> NotSupported | None:
    """May a program of prog_type (TRACING: of attach type `attach`, against BTF type `btf_id`) call helper h (a
    bpf.uapi.Helper)?
    A tiny program calls it with zeroed arguments. The verifier refuses an unknown or disallowed helper
    ("invalid func", "unknown func", "cannot use helper") before it looks at the arguments, so any other refusal
    means callable (as libbpf's libbpf_probe_bpf_helper decides). Cached per helper and `label` (default: the
    program kind)."""
    kind = label or (f"{attach.name.lower()} programs" if prog_type == ProgType.TRACING
                     else f"{prog_type.name.lower()} programs")
    known = h in Helper.__members__.values()
    name = f"bpf_{Helper(h).name}" if known else f"helper #{h}"
    since = HELPER_SINCE.get(Helper(h).name) if known else None

    def fn():
        insns = [asm.movi(r, 0) for r in (asm.R1, asm.R2, asm.R3, asm.R4, asm.R5)]
        insns += [asm.call(h), asm.movi(asm.R0, 0), asm.exit_()]
        try:
            load(prog_type, insns, name="probe", expected_attach_type=attach, attach_btf_id=btf_id,
                 attach_btf_obj_fd=btf_obj_fd, what=f"probe {name} in {kind}").close()
        except VerifierError as e:
            if "invalid func" in e.log:
                raise NotSupported(name, f"this kernel has no {name} helper"
                                         + (f" (Linux {since}+)" if since else "")) from None
            if "unknown func" in e.log or "cannot use helper" in e.log:
                raise NotSupported(name, f"{kind} may not call {name} on this kernel") from None
            # known and allowed; the zeroed arguments were what the verifier did not like
    return probe(f"{name} in {kind}", fn)


def division_ranges() -> NotSupported | None:
    """Does the verifier track value ranges through a division (Linux 7.0+)? A program divides a known 5 by 1
    and reads past its stack only where the result is not 5: a verifier that tracks the division never walks
    there and accepts it; one that does not refuses it. (bpf.cbpf makes loops verifiable with a division the
    verifier cannot follow, or with an xor where it can.)"""
    def fn():
        insns = [asm.alu32(asm.MOV, asm.R0, 5), asm.alu32(asm.DIV, asm.R0, 1), asm.jmp32(asm.JEQ, asm.R0, 5, "ok"),
                 asm.ldx(asm.DW, asm.R0, asm.FP, 8), asm.label("ok"), asm.movi(asm.R0, 0), asm.exit_()]
        try:
            load(ProgType.SOCKET_FILTER, insns, name="probe", what="probe division ranges").close()
        except VerifierError:
            raise NotSupported("ranges through a division", "the verifier tracks no ranges through a division "
                                                             "(Linux 7.0+ does)") from None
    return probe("ranges through a division", fn)

