"""--stack: the kernel stack of each record. The capture program stores the stack in a stack trace map with
bpf_get_stackid (the kernel keeps one copy of each distinct stack: the record carries its id, META's stack); user
space reads each id's addresses once and names them from /proc/kallsyms (fcap.host.kallsyms), innermost frame
first. Where the programs write the file rings, user space gives them each id's comment text as it reads it
(Stacks.give_to), and they write it into the records of that id after it themselves (fcap.kernel.ringrec).

The ids stay true: without BPF_F_REUSE_STACKID a stack that hashes to a bucket another stack holds is not stored
(-EEXIST: the record's stack is unknown, STACK_NONE) rather than replacing it, so an id read back later names the
stack its record had, never a later packet's; nothing deletes entries while the capture runs, so an id's stack can
be cached. A stack not stored, or an id the map does not hold, shows as unknown: the empty tuple."""

from __future__ import annotations

import struct
from typing import Callable

from bpf.asm import DW, FP, JSLT, R0, R1, R2, R3, R7, call, ja, jmp, label, ld_map_fd, ldx, movi
from bpf.uapi import Helper

from fcap.host import kallsyms
from fcap.kernel.parts import RECORD_META, Part, MapUse
from fcap.kernel.layout import META, STACK, STACK_NONE, STK_KEY, STK_TEXT, Record
from fcap.points import kinds

DEPTH = 64               # frames kept of each stack (deeper stacks lose their outermost frames)
STACK_MAX = 16384        # distinct stacks the map holds (its buckets: stacks hashing alike are not stored)
assert STACK_MAX < STACK_NONE
# bpf_get_stackid's flags: no BPF_F_REUSE_STACKID (see the docstring), and the frames to skip: those every stack at
# a point of the kind starts with, fcap's. The helper starts where the program called it: tp_btf and raw_tp, the
# program and bpf_trace_runN (then __traceiter_NAME, left out below, then the function that hit the tracepoint:
# __dev_queue_xmit at net_dev_queue); fentry and fexit, the program and the trampoline (then the function itself,
# at the return address of its call to the trampoline: ip_finish_output2+0x9). A kprobe program's stack starts at
# the probed instruction (ip_finish_output2+0x5): nothing to skip. (Seen on 6.18 and Debian's 6.12.)
STACKID_FLAGS = 0
SKIP = {kinds.TP_BTF: 2, kinds.RAW_TP: 2, kinds.FENTRY: 2, kinds.FEXIT: 2}
# frames of the tracing machinery the skip count cannot cover (there or not as the kernel was built and as many
# probes share the tracepoint): left out in user space while they lead the stack
MACHINERY = ("bpf_prog_", "bpf_trampoline_", "__bpf_trace_", "bpf_trace_run", "__traceiter_", "__bpf_prog_enter",
             "kprobe_ftrace_handler", "kprobe_perf_func", "kprobe_dispatcher")
# The comment's stack: 'FUNC+0xOFF<CALLER+0xOFF<...' (innermost first, '<': called from; '?' for a stack the kernel
# did not keep): written by fcap.features.kernel_stack, read back by frames()
SEPARATOR = "<"
UNKNOWN = "?"


def flags(point) -> int:
    """bpf_get_stackid's flags at `point`."""
    return STACKID_FLAGS | SKIP.get(point.kind, 0)


def emit_stackid(b) -> None:
    """META's stack = bpf_get_stackid(ctx, stack map, flags), STACK_NONE where the kernel did not store it."""
    none, done = b.fresh("stack_none"), b.fresh("stack_done")
    b.emit(ldx(DW, R1, FP, STACK.ctx), ld_map_fd(R2, b.maps.stack), movi(R3, flags(b.point)),
           call(Helper.get_stackid), jmp(JSLT, R0, 0, none), META.store(R7, "stack", R0), ja(done),
           label(none), META.store_imm(R7, "stack", STACK_NONE), label(done))


STACKS = Part("stack", on=lambda point, options, maps: options.stack, stages={RECORD_META: emit_stackid},
                 fields=("stack",),
                 maps=(MapUse("stack", f"STACK_TRACE, {STACK_MAX} stacks of {DEPTH} frames; the session's"),),
                 reads="fcap.kernel.kstack.Stacks")


# ---- user space ---------------------------------------------------------------------------------------------------

class Stacks:
    """The frames of a capture's stack ids: read from the stack map once per id, named from /proc/kallsyms."""

    def __init__(self, stack_map, symbols: kallsyms.Symbols | None = None):
        self.map = stack_map
        # (read by the session once the capture's programs are loaded, before they attach: a stack that still holds
        # a BPF program's frame names it, not a program of an earlier capture at the same address)
        self.symbols = symbols or kallsyms.Symbols()
        self._cache: dict[int, tuple[str, ...]] = {}
        self._given = self._comment = None   # give_to's

    @classmethod
    def create(cls, maps: list, size: int = 0) -> Stacks:
        """A capture's stack map (appended to `maps`, the session's to close) and its reader."""
        from bpf.maps import StackTraceMap
        stack_map = StackTraceMap(DEPTH, size or STACK_MAX, name="fcap_stacks")
        maps.append(stack_map)
        return cls(stack_map)

    def frames(self, stack_id: int) -> tuple[str, ...]:
        """FUNC+0xOFF per frame, innermost first; () for an unknown stack."""
        got = self._cache.get(stack_id)
        if got is None:
            got = self._cache[stack_id] = self._read(stack_id)
            if self._given is not None:
                self._give(stack_id, got)
        return got

    def give_to(self, texts, comment: Callable[[tuple], str]) -> None:
        """From now on, give the programs each id's comment text (`comment` of its frames) when it is first read:
        `texts`, their map (layout.STK_KEY -> STK_TEXT, fcap.kernel.ringrec), from which they write it into the
        records of the packets after it themselves (an id's frames never change: given once, for good)."""
        self._given, self._comment = texts, comment

    def _give(self, stack_id: int, frames: tuple) -> None:
        from fcap.kernel.ringrec import give
        give(self._given, STK_KEY.struct.pack(stack_id), STK_TEXT, self._comment(frames))

    def _read(self, stack_id: int) -> tuple[str, ...]:
        if stack_id == STACK_NONE:
            return ()
        addrs = self.map.addresses(stack_id)
        if not addrs:
            return ()
        names = [self.symbols.name(a, ret=i > 0) for i, a in enumerate(addrs)]
        return trim(names)

    def parser(self, parse, at: int = 0):
        """`parse` (a perf sample's bytes -> Record) with each Record's stack filled in; META starts at `at`."""
        off = at + META.off("stack")
        unpack = struct.Struct("<H").unpack_from
        i = Record._fields.index("stack")   # (the tuple rebuilt around it: _replace costs ~1 us more a record)
        make = tuple.__new__

        def parse_with_stack(raw):
            rec = parse(raw)
            return make(Record, rec[:i] + (self.frames(unpack(raw, off)[0]),) + rec[i + 1:])
        return parse_with_stack


def trim(names: list[str]) -> tuple[str, ...]:
    """The frames less the tracing machinery's that lead them."""
    i = 0
    while i < len(names) and names[i].startswith(MACHINERY):
        i += 1
    return tuple(names[i:])


def text(stack: tuple) -> str:
    """The comment's value of a stack's frames (() unknown)."""
    return SEPARATOR.join(stack) if stack else UNKNOWN


def frames(value: str) -> tuple:
    """The frames of the comment's stack= value (() unknown)."""
    return () if value == UNKNOWN else tuple(value.split(SEPARATOR))
