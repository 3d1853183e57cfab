"""One object per kind of capture point (fentry, fexit, tp_btf, raw_tp, kprobe, the multi-attach kinds that run
one program at many functions: fentry.multi, fexit.multi, kprobe.multi, and fentry/fexit on loaded XDP and tc
programs: xdp.entry, xdp.exit, tc.entry, tc.exit): the program type the kernel loads there, how the program's
context holds the arguments on each architecture, how it attaches, which kernel feature it needs and how a refusal
reads. A Point holds its kind (point.kind); everything else asks the kind's attributes, so no module but this one
knows a kind by its name (the -i grammar maps text to a kind with get())."""

from __future__ import annotations

import errno
import os
from typing import NamedTuple, Protocol

from bpf import asm, probes
from bpf.errors import BPFError, NotSupported
from bpf.link import (Link, attach_kprobe, attach_kprobe_multi, attach_raw_tracepoint, attach_tracing,
                      attach_tracing_multi)
from bpf.uapi import AttachType, Helper, ProgType

from fcap.errors import PointError


class PointLike(Protocol):
    """What a kind reads of a point (fcap.points.spec.Point, which holds its kind: this module stays below it)."""

    spec: str            # as the user named it
    name: str            # the function, tracepoint or program
    btf_id: int          # its BTF id (fentry, tp_btf)
    target: object       # the program it is on (xdp.entry, ...)
    kind: object         # its Kind

ENOTSUPP = 524   # (the kernel's own: no user-space name) e.g. a function ftrace cannot patch
SKB_STRUCT, XDP_STRUCT = "sk_buff", "xdp_buff"   # what a kind's programs' context argument points to (Kind.context)
ALTERNATIVE = "capture at a tracepoint that sees the same packets"


# ---- architectures: where a kprobe program finds a function's arguments ----------------------------------------

class Arch(NamedTuple):
    """How a kprobe program's context (the registers saved at the probe, bpf_user_pt_regs_t) holds a function's
    arguments on one architecture: the calling convention's argument registers and their offsets. Both structs
    are user ABI (ptrace), so the offsets are constants; tests/test_kinds.py holds them to the kernel's BTF."""

    machine: str                   # os.uname().machine
    regs: str                      # the struct the context points to
    arg_regs: tuple[str, ...]      # the members that hold arguments 1, 2, ... (beyond them: on the stack)
    arg_offsets: tuple[int, ...]   # their byte offsets in that struct
    ret_reg: str                   # at a function's entry, the member holding its return address (into its caller):
    ret_offset: int                # the link register, or the stack pointer where the call pushed it (ret_on_stack);
    ret_on_stack: bool             # its byte offset


X86_64 = Arch("x86_64", "pt_regs", ("di", "si", "dx", "cx", "r8", "r9"), (112, 104, 96, 88, 72, 64), "sp", 152, True)
ARM64 = Arch("aarch64", "user_pt_regs", tuple(f"regs[{i}]" for i in range(8)), tuple(8 * i for i in range(8)),
             "regs[30]", 240, False)
ARCHES = {a.machine: a for a in (X86_64, ARM64)}


def machine() -> str:
    """This machine's architecture as the kernel names it: the one place fcap asks."""
    return os.uname().machine


def arch(name: str | None = None) -> Arch:
    """The Arch called `name` (default: this machine's); a one-line PointError for one fcap does not know, rather
    than a wrong offset."""
    name = name or machine()
    found = ARCHES.get(name)
    if found is None:
        raise PointError(f"kprobe points: fcap does not know where {name} passes function arguments "
                         f"(it knows {', '.join(ARCHES)}); capture at fentry/FUNC or a tracepoint")
    return found


# ---- the kinds --------------------------------------------------------------------------------------------------

class Kind:
    """A kind of capture point. One instance per kind (get(name), or the constants below): compare kinds by
    identity, or better ask what differs. str() is the name, as the -i grammar and the specs spell it."""

    name = ""
    prog_type: ProgType   # what the kernel loads there
    attach_type = AttachType.NONE   # the load's expected_attach_type (NONE: the load takes none)
    typed = False         # BTF types the context: the skb is a trusted pointer, loads need no probe_read
    function = False      # at a kernel function (else at a tracepoint)
    sees_return = False   # the function's return value is readable (`return` in --where/--dump)
    at_entry = False      # runs before the function's body: what the function sets is not set yet
    by_symbol = False     # attaches to a /proc/kallsyms symbol (not to a BTF id)
    family = ""           # how a refusal names the programs refused with it
    summary = ""          # what a point of this kind is, in one line (fcap --help, man fcap)
    multi = False         # one program at many functions: the point id is the attach cookie, not a constant
    single: Kind | None = None   # a multi kind: the kind of the points it runs at (fentry, fexit, kprobe)
    operand = "TP"        # what follows KIND/ in the -i grammar (fcap --help)
    context = SKB_STRUCT  # the kernel struct the context argument points to: the skb, or an XDP program's xdp_buff
    on_program = False    # at a loaded BPF program (its fd is the load's attach_prog_fd), not a kernel function
    skb_may_be_gone = False   # the function may have freed the skb or handed it on when the program runs (fexit):
                              # read it only through loads the kernel checks and probe reads, never through a
                              # helper that copies from it (bpf_skb_output, skb dynptrs)

    def __str__(self) -> str:
        return self.name

    @property
    def on_skb(self) -> bool:
        """Its programs' context argument is an skb (not an XDP program's xdp_buff)."""
        return self.context == SKB_STRUCT

    def __repr__(self) -> str:
        return f"<kind {self.name}>"

    # -- arguments
    def arg_count(self, machine_name: str | None = None) -> int | None:
        """How many of a function's arguments the context holds (None: every one)."""
        return None

    def has_arg(self, index: int, machine_name: str | None = None) -> bool:
        n = self.arg_count(machine_name)
        return n is None or index < n

    def arg_offset(self, index: int, machine_name: str | None = None) -> int:
        """Where argument `index` (0-based; at fexit, `return` is the one past the last) is in the context: a u64
        slot each, whatever the architecture."""
        return 8 * index

    def load_arg(self, dst: int, index: int, tmp: int) -> list:
        """Instructions that put argument `index` in register `dst` from the context in R1 (may use R1-R5 and the
        8-byte stack slot at `tmp`)."""
        return [asm.ldx(asm.DW, dst, asm.R1, self.arg_offset(index))]

    def load_caller(self, dst: int, at: CallerSlots) -> list | None:
        """Instructions that put the function's return address (where its caller goes on: the location a drop
        tracepoint names) in `dst` (R0 or R6-R9), 0 where it cannot be read; they may use R1-R5 and the stack slots
        `at` names. None where the kind cannot say (here)."""
        return None

    def load_arg_at(self, dst: int, tmp: int, missing: str) -> list:
        """A multi kind's: argument number R2 (known only when the program runs: the attach cookie says) into
        `dst` from the context in R1; to `missing` where there is none. May use R1-R5 and the stack slot at
        `tmp`. Here: a constant offset per argument (a context takes no other)."""
        items, done = [], f"{missing}_arg_done"
        for i in range(self.arg_count() or 0):
            items += [asm.jmp(asm.JNE, asm.R2, i, f"{missing}_arg_{i + 1}"), asm.ldx(asm.DW, dst, asm.R1,
                                                                                     self.arg_offset(i)),
                      asm.ja(done), asm.label(f"{missing}_arg_{i + 1}")]
        return items + [asm.ja(missing), asm.label(done)]

    # -- the kernel
    def load_attach_type(self) -> int:
        """The load's expected_attach_type as this kernel numbers it."""
        return self.attach_type

    def attach(self, prog_fd: int, point: PointLike) -> Link:
        """Attach the loaded program at `point` (a BTF-typed program's target was fixed at load time)."""
        return attach_tracing(prog_fd, point.spec)

    def probe(self, btf_id: int = 0, btf_obj_fd: int = 0) -> NotSupported | None:
        """The cached bpf.probes probe of whether this kernel loads programs of this kind (at BTF id `btf_id`
        where the kind attaches to one); None when it does. The probe is per kind: its first answer stays."""
        return probes.tracing_program(self.attach_type, btf_id, btf_obj_fd, label=f"{self.name} programs")

    def refusal(self, point: PointLike, alternative: str) -> str | None:
        """One line when the kernel refuses every program of this kind (so every point alike), naming the
        tracepoint `alternative` that sees the same packets; None when it may load one (tried before a load)."""
        return None

    def explain(self, point: PointLike, e: BPFError, alternative: str) -> str:
        """The kernel's refusal `e` to load or attach a program at `point`, in one line."""
        problem = probes.privilege_problem() if e.errno in (errno.EPERM, errno.EACCES) else None
        if problem:
            return f"{point.spec}: the kernel refused the program ({errno.errorcode[e.errno]}): {problem}"
        if e.errno == errno.EPERM:
            return (f"{point.spec}: this kernel refuses {self.family or self.name} programs (EPERM); "
                    f"{ALTERNATIVE}: {alternative}")
        if e.errno == ENOTSUPP:
            return f"{point.spec}: the kernel does not support a trampoline there (ENOTSUPP)"
        return f"{point.spec}: {e}"


class CallerSlots(NamedTuple):
    """The stack slots (offsets from the frame pointer) load_caller may use: the context's, an 8-byte temporary,
    CALLER_FRAMES u64s for a stack, and a name for its labels (unique in the program)."""

    ctx: int
    tmp: int
    frames: int
    name: str


CALLER_FRAMES = 6    # frames of the stack a trampoline's program looks through for its function and its caller
# A frame in [the function's address, + this) is the function's own call to the trampoline (after any landing pad)
CALL_SITE_BYTES = 32


def trampoline_caller(dst: int, at: CallerSlots) -> list:
    """At a trampoline's entry: the stack from the program (bpf_get_stack) holds the program, the trampoline, the
    function at its call to the trampoline, then its caller; the frame after the one within CALL_SITE_BYTES of
    the function's address (bpf_get_func_ip) is the return address. Not found: 0, never another frame."""
    found, none, done = f"{at.name}_found", f"{at.name}_none", f"{at.name}_done"
    out = [asm.ldx(asm.DW, asm.R1, asm.FP, at.ctx), asm.call(Helper.get_func_ip),
           asm.stx(asm.DW, asm.FP, at.tmp, asm.R0), asm.ldx(asm.DW, asm.R1, asm.FP, at.ctx),
           asm.mov(asm.R2, asm.FP), asm.addi(asm.R2, at.frames), asm.movi(asm.R3, 8 * CALLER_FRAMES),
           asm.movi(asm.R4, 0), asm.call(Helper.get_stack), asm.mov(asm.R5, asm.R0),
           asm.ldx(asm.DW, asm.R4, asm.FP, at.tmp)]
    for i in range(CALLER_FRAMES - 1):   # frame i the function's and frame i + 1 there: that one
        out += [asm.jmp(asm.JSLT, asm.R5, 8 * (i + 2), none), asm.ldx(asm.DW, asm.R3, asm.FP, at.frames + 8 * i),
                asm.alu64(asm.SUB, asm.R3, asm.R4, reg=True), asm.jmp(asm.JLT, asm.R3, CALL_SITE_BYTES, f"{found}_{i}")]
    out.append(asm.ja(none))
    for i in range(CALLER_FRAMES - 1):
        out += [asm.label(f"{found}_{i}"), asm.ldx(asm.DW, dst, asm.FP, at.frames + 8 * (i + 1)), asm.ja(done)]
    return out + [asm.label(none), asm.movi(dst, 0), asm.label(done)]


class _Trampoline(Kind):
    """fentry/fexit: a BPF trampoline on a function named by its BTF id; the context is the arguments as u64s."""

    prog_type = ProgType.TRACING
    typed = True
    function = True
    family = "fentry/fexit"
    operand = "FUNC"

    def refusal(self, point: PointLike, alternative: str) -> str | None:
        refused = self.probe(point.btf_id)
        if refused is not None and refused.errno == errno.EPERM:   # a policy refusing trampolines altogether
            return self.explain(point, refused, alternative)
        return None


class _Fentry(_Trampoline):
    name = "fentry"
    summary = "a BPF trampoline at FUNC's entry (vmlinux or a module), arguments typed"
    attach_type = AttachType.TRACE_FENTRY
    at_entry = True

    def load_caller(self, dst: int, at: CallerSlots) -> list | None:
        return trampoline_caller(dst, at)


class _Fexit(_Trampoline):
    name = "fexit"
    summary = "a BPF trampoline at FUNC's return: the skb after FUNC, and its return value ('return')"
    attach_type = AttachType.TRACE_FEXIT
    sees_return = True
    skb_may_be_gone = True


class _TpBtf(Kind):
    """A BTF-typed raw tracepoint: the context is the tracepoint's arguments (after its void *) as u64s."""

    name = "tp_btf"
    summary = "a BTF-typed tracepoint (also spelled tp/SUBSYS/TP): net_dev_queue, netif_receive_skb, ..."
    prog_type = ProgType.TRACING
    attach_type = AttachType.TRACE_RAW_TP
    typed = True


class _RawTp(Kind):
    """A raw tracepoint by name: the same u64 arguments, untyped (read through probe_read)."""

    name = "raw_tp"
    summary = "a raw tracepoint, arguments untyped (linear bytes only)"
    prog_type = ProgType.RAW_TRACEPOINT

    def attach(self, prog_fd: int, point: PointLike) -> Link:
        return attach_raw_tracepoint(prog_fd, point.name)

    def probe(self, btf_id: int = 0, btf_obj_fd: int = 0) -> NotSupported | None:
        return None   # (raw tracepoints: 4.17, older than anything else fcap needs)


class _Kprobe(Kind):
    """A kprobe perf event on a kallsyms symbol: the context is the saved registers (see Arch), untyped."""

    name = "kprobe"
    summary = "a kprobe at FUNC's entry, arguments from registers (linear bytes only)"
    prog_type = ProgType.KPROBE
    function = True
    operand = "FUNC"
    at_entry = True
    by_symbol = True

    def arg_count(self, machine_name: str | None = None) -> int | None:
        return len(arch(machine_name).arg_offsets)

    def arg_offset(self, index: int, machine_name: str | None = None) -> int:
        offsets = arch(machine_name).arg_offsets
        if index >= len(offsets):
            raise PointError(f"kprobe points: argument {index + 1} is past the registers")
        return offsets[index]

    def load_caller(self, dst: int, at: CallerSlots) -> list | None:
        """The link register; or where the stack pointer points, as the call pushed it (read with probe_read)."""
        a = arch()
        if not a.ret_on_stack:
            return [asm.ldx(asm.DW, asm.R1, asm.FP, at.ctx), asm.ldx(asm.DW, dst, asm.R1, a.ret_offset)]
        return [asm.ldx(asm.DW, asm.R1, asm.FP, at.ctx), asm.ldx(asm.DW, asm.R3, asm.R1, a.ret_offset),
                asm.mov(asm.R1, asm.FP), asm.addi(asm.R1, at.tmp), asm.movi(asm.R2, 8),
                asm.st(asm.DW, asm.FP, at.tmp, 0), asm.call(Helper.probe_read_kernel),
                asm.ldx(asm.DW, dst, asm.FP, at.tmp)]

    def attach(self, prog_fd: int, point: PointLike) -> Link:
        return attach_kprobe(prog_fd, point.name)

    def probe(self, btf_id: int = 0, btf_obj_fd: int = 0) -> NotSupported | None:
        return probes.kprobe_program()

    def refusal(self, point: PointLike, alternative: str) -> str | None:
        refused = self.probe()
        if refused is None:
            return None
        return f"{point.spec}: {refused.reason}; {ALTERNATIVE}: {alternative}"

    def explain(self, point: PointLike, e: BPFError, alternative: str) -> str:
        if e.errno in (errno.ENOENT, errno.EINVAL, errno.ESRCH):
            return f"{point.spec}: the kernel cannot probe {point.name}: {e}"
        return super().explain(point, e, alternative)


FENTRY, FEXIT, TP_BTF, RAW_TP, KPROBE = _Fentry(), _Fexit(), _TpBtf(), _RawTp(), _Kprobe()


# ---- multi-attach kinds: one program at many functions, the attach cookie naming the point --------------------

class _TracingMulti(Kind):
    """fentry/fexit through a tracing-multi link (BPF_TRACE_FENTRY_MULTI / FEXIT_MULTI): the program is loaded
    against no one function, so the verifier types nothing in its context (the skb is read through probe_read, as
    at a kprobe) and reads the arguments through bpf_get_func_arg."""

    prog_type = ProgType.TRACING
    function = True
    multi = True
    family = "fentry/fexit"

    def load_arg(self, dst: int, index: int, tmp: int) -> list:
        return [asm.movi(asm.R2, index)] + self.load_arg_at(dst, tmp, "")

    def load_arg_at(self, dst: int, tmp: int, missing: str) -> list:
        """bpf_get_func_arg(ctx, R2, &tmp): any argument the function has (0 where it has no such one)."""
        return [asm.st(asm.DW, asm.FP, tmp, 0), asm.mov(asm.R3, asm.FP), asm.addi(asm.R3, tmp),
                asm.call(Helper.get_func_arg), asm.ldx(asm.DW, dst, asm.FP, tmp)]

    def arg_offset(self, index: int, machine_name: str | None = None) -> int:
        raise PointError(f"{self.name} points: arguments other than the skb are not read at a multi-attach point")

    def load_attach_type(self) -> int:
        """The attach type as this kernel numbers it (read from its BTF)."""
        return probes.attach_type(self.attach_type.name)

    def probe(self, btf_id: int = 0, btf_obj_fd: int = 0) -> NotSupported | None:
        return probes.tracing_multi(self.attach_type.name)

    def attach_many(self, prog_fd: int, points: list[PointLike], cookies: list[int]) -> Link:
        """One link running the program at every point, bpf_get_attach_cookie() giving the cookie at the same
        index."""
        return attach_tracing_multi(prog_fd, self.load_attach_type(), [p.btf_id for p in points], cookies,
                                    what=f"{self.name} ({len(points)} functions)")


class _FentryMulti(_TracingMulti):
    name = "fentry.multi"
    summary = "fentry at many functions through one tracing-multi link (chosen by fcap for globs)"
    attach_type = AttachType.TRACE_FENTRY_MULTI
    at_entry = True
    single = FENTRY

    def load_caller(self, dst: int, at: CallerSlots) -> list | None:
        return trampoline_caller(dst, at)


class _FexitMulti(_TracingMulti):
    name = "fexit.multi"
    summary = "fexit at many functions through one tracing-multi link (chosen by fcap for globs)"
    attach_type = AttachType.TRACE_FEXIT_MULTI
    single = FEXIT


class _KprobeMulti(_Kprobe):
    """Kprobes at many kallsyms symbols through one kprobe-multi link (BPF_TRACE_KPROBE_MULTI, 5.18): the context
    is the saved registers, as at a kprobe."""

    name = "kprobe.multi"
    summary = "kprobes at many functions through one kprobe-multi link (chosen by fcap for globs)"
    attach_type = AttachType.TRACE_KPROBE_MULTI
    multi = True
    single = KPROBE

    def probe(self, btf_id: int = 0, btf_obj_fd: int = 0) -> NotSupported | None:
        return probes.kprobe_multi()

    def attach_many(self, prog_fd: int, points: list[PointLike], cookies: list[int]) -> Link:
        return attach_kprobe_multi(prog_fd, [p.name for p in points], cookies,
                                   what=f"{self.name} ({len(points)} functions)")


FENTRY_MULTI, FEXIT_MULTI, KPROBE_MULTI = _FentryMulti(), _FexitMulti(), _KprobeMulti()
MULTI: tuple[Kind, ...] = (FENTRY_MULTI, FEXIT_MULTI, KPROBE_MULTI)


def multi_for(kind: Kind) -> tuple[Kind, ...]:
    """The multi-attach kinds that may run the points of `kind` together, best first: tracing-multi for fentry and
    fexit, kprobe-multi for kprobe (and for fentry, reading the skb untyped as a kprobe does)."""
    if kind is FENTRY:
        return FENTRY_MULTI, KPROBE_MULTI
    if kind is FEXIT:
        return (FEXIT_MULTI,)
    if kind is KPROBE:
        return (KPROBE_MULTI,)
    return ()


# ---- kinds on BPF programs: fentry/fexit on a loaded XDP or tc program ------------------------------------------

class _OnProgram(_Trampoline):
    """fentry/fexit on a loaded BPF program: attach_btf_id is its main function in the program's own BTF and the
    program's fd the load's attach_prog_fd (point.target); the verifier types the context argument as the kernel
    struct the program's context stands for (struct xdp_md: xdp_buff, struct __sk_buff: sk_buff)."""

    on_program = True
    operand = "PROG"
    target_type: ProgType     # the type of the programs it attaches to
    word = ""                 # how -i names both ends (xdp/PROG), and the programs in list-devices
    label = ""                # how a message names those programs ("no XDP program ...")
    ctx_name = ""             # how the target's BTF names its context struct
    alternative = ""          # what sees the same packets where the kernel refuses fentry/fexit

    def refusal(self, point: PointLike, alternative: str) -> str | None:
        refused = probes.tracing_program(self.attach_type, point.btf_id, point.target.fd,
                                           label=f"{self.name} programs")
        if refused is not None and refused.errno == errno.EPERM:
            return self.explain(point, refused, alternative)
        return None

    def explain(self, point: PointLike, e: BPFError, alternative: str) -> str:
        return super().explain(point, e, self.alternative)


class _XdpEntry(_OnProgram):
    name = "xdp.entry"
    summary = "an XDP program's entry: the packet as it arrives (xdp/PROG: entry and exit)"
    attach_type = AttachType.TRACE_FENTRY
    at_entry = True
    context = XDP_STRUCT
    target_type = ProgType.XDP
    word, label = "xdp", "XDP"
    ctx_name = "xdp_md"
    alternative = "tp_btf/netif_receive_skb (the packets XDP passes, after it)"


class _XdpExit(_XdpEntry):
    name = "xdp.exit"
    summary = "an XDP program's return: the packet as it left it, and its verdict (XDP_DROP, ...)"
    attach_type = AttachType.TRACE_FEXIT
    at_entry = False
    sees_return = True


class _TcEntry(_OnProgram):
    name = "tc.entry"
    summary = "a tc program's entry: the skb as it arrives (tc/PROG: entry and exit)"
    attach_type = AttachType.TRACE_FENTRY
    at_entry = True
    target_type = ProgType.SCHED_CLS
    word, label = "tc", "tc"
    ctx_name = "__sk_buff"
    alternative = "tp_btf/netif_receive_skb (before tc ingress) or tp_btf/net_dev_queue (before tc egress)"


class _TcExit(_TcEntry):
    name = "tc.exit"
    summary = "a tc program's return: the skb as it left it, and its verdict (TC_ACT_SHOT, ...)"
    attach_type = AttachType.TRACE_FEXIT
    at_entry = False
    sees_return = True


XDP_ENTRY, XDP_EXIT, TC_ENTRY, TC_EXIT = _XdpEntry(), _XdpExit(), _TcEntry(), _TcExit()
# -i's words for a program's entry and exit together
PROGRAM_WORDS: dict[str, tuple[Kind, ...]] = {ks[0].word: ks for ks in ((XDP_ENTRY, XDP_EXIT), (TC_ENTRY, TC_EXIT))}

# Every kind -i spells, in the order the grammar lists them (the multi kinds above are fcap's choice for many
# points of one of these, never spelled; nothing else names kinds).
ALL: tuple[Kind, ...] = (FENTRY, FEXIT, TP_BTF, RAW_TP, KPROBE, XDP_ENTRY, XDP_EXIT, TC_ENTRY, TC_EXIT)
_BY_NAME = {k.name: k for k in ALL}


def program_kinds(word: str) -> tuple[Kind, ...]:
    """The kinds on BPF programs -i's `word` names: xdp and tc both ends, xdp.entry etc. one; () for others."""
    k = _BY_NAME.get(word)
    return PROGRAM_WORDS.get(word) or ((k,) if k is not None and k.on_program else ())


def for_program_type(prog_type: int) -> tuple[Kind, ...]:
    """The (entry, exit) kinds on programs of type `prog_type`, or ()."""
    return next((ks for ks in PROGRAM_WORDS.values() if ks[0].target_type == prog_type), ())


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def get(name: str) -> Kind | None:
    """The kind called `name` (as -i spells it), or None."""
    return _BY_NAME.get(name)
