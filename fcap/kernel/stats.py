"""Per-point counts: what each point saw (hits), kept (after predicates and filter) and lost (a full buffer), counted
by the programs per CPU, summed in user space, and written at the end of a pcapng file as one Interface Statistics
Block per point."""

from __future__ import annotations

from typing import NamedTuple

from bpf.asm import DW, FP, JEQ, R0, R1, R2, R8, addi, call, jmp, label, ld_map_fd, ldx, mov, stx
from bpf.uapi import Helper

from fcap.kernel.parts import END, ENTRY, Part, MapUse, always
from fcap.kernel.layout import COUNTER_HITS, COUNTER_LOST, COUNTER_SEEN, STACK


def counts_hits(opts) -> bool:
    """Whether the program counts its hits: only when predicates or a filter may turn packets away (otherwise
    every hit is a packet seen, and the count would cost every packet a lookup for nothing)."""
    return bool(opts.predicates) or opts.filter is not None


def emit_hit(b) -> None:
    """hits += 1 in this point's counters (after STACK.key holds the point id). Uses R0-R2."""
    done = b.fresh("hit")
    b.emit(ld_map_fd(R1, b.maps.counters), mov(R2, FP), addi(R2, STACK.key), call(Helper.map_lookup_elem),
           jmp(JEQ, R0, 0, done), ldx(DW, R1, R0, 8 * COUNTER_HITS), addi(R1, 1),
           stx(DW, R0, 8 * COUNTER_HITS, R1), label(done))


def emit_counts(b) -> None:
    """After the record's write (R0: its result): seen += 1, and lost += 1 when the buffer was full. Uses R0-R2,
    R8."""
    b.emit(mov(R8, R0), ld_map_fd(R1, b.maps.counters), mov(R2, FP), addi(R2, STACK.key),
           call(Helper.map_lookup_elem), jmp(JEQ, R0, 0, "out"),
           ldx(DW, R1, R0, 8 * COUNTER_SEEN), addi(R1, 1), stx(DW, R0, 8 * COUNTER_SEEN, R1),
           jmp(JEQ, R8, 0, "out"),
           ldx(DW, R1, R0, 8 * COUNTER_LOST), addi(R1, 1), stx(DW, R0, 8 * COUNTER_LOST, R1))


_COUNTERS = MapUse("counters", "PERCPU_ARRAY, a value of COUNTERS u64s per point (key: the point id); the session's")
HITS = Part("hits", on=lambda point, options, maps: counts_hits(options), stages={ENTRY: emit_hit},
               maps=(_COUNTERS,), reads="fcap.kernel.stats.read")
COUNTS = Part("counts", on=always, stages={END: emit_counts}, maps=(_COUNTERS,), reads="fcap.kernel.stats.read")


class PointStats(NamedTuple):
    hits: int       # times the point's program ran (a packet passed the point)
    seen: int       # packets kept by the predicates and the filter (the program tried to record them)
    lost: int       # of those, records the kernel had no room for


def read(counters, points, counted_hits: bool) -> list[PointStats]:
    """Each point's counts (in the order of `points`, keyed by their ids) from the counters map."""
    out = []
    every = counters.lookup_all_percpu()   # (a glob's thousands of points: a few calls, not one per point)
    for p in points:
        cpus = every[p.id]

        def total(i: int) -> int:
            return sum(int.from_bytes(v[8 * i: 8 * i + 8], "little") for v in cpus)
        seen = total(COUNTER_SEEN)
        hits = total(COUNTER_HITS) if counted_hits else seen
        out.append(PointStats(hits, seen, total(COUNTER_LOST)))
    return out


def with_seen(stats: list[PointStats], seen: int, counted_hits: bool) -> list[PointStats]:
    """The counts read() gave, with the one point's seen count `seen` where the programs did not count it (the file
    rings count their records)."""
    return [PointStats(s.hits if counted_hits else seen, seen, s.lost) for s in stats]


def write_isbs(writer, stats: list[PointStats], start_ns: int, end_ns: int, comment: str = "") -> None:
    """One Interface Statistics Block per point (interface i = point i): isb_starttime/endtime (the capture's
    attach and detach, wall clock), isb_ifrecv (hits), isb_filteraccept (kept), isb_ifdrop (lost); `comment` (the
    records written out of time order, fcap.live.order.Window.disorder) on each."""
    for iface, s in enumerate(stats):
        writer.write_isb(iface, end_ns, start_ns=start_ns, end_ns=end_ns, ifrecv=s.hits, ifdrop=s.lost,
                         filteraccept=s.seen, comment=comment or None)
