"""The capture program's own cost, side by side: BPF ns per captured packet of fcap's pcap and pcapng programs of
one or more trees, against an empty program and one that only reads the clock, in interleaved rounds.

    python -m bench.own_cost [--rounds 5] [-n 200000] [--tree NAME=PATH ...] [--ablate const|keep] [--no-comment]
                             [--sender] [--format pcap|pcapng] [--point POINT ...] [--filter TEXT]

Each fcap case runs the command as users do (`fcap -i tp_btf/net_dev_queue -s 128 -w FILE` on CPU 1, SCHED_FIFO)
while bench/sender.c sends N 64-byte datagrams from CPU 0; the run time per hit comes from the kernel's run-time
stats. The floors are loaded here: an empty program (stats timing, trampoline) and one that only calls
bpf_ktime_get_ns. "Own" is a case's median less the clock-only program's: what capturing costs beyond reading the
clock. --ablate adds each tree's programs with bpf_ktime_get_ns replaced by the constant 1 (the clock's cost in
the program: the case less its ablation); --no-comment adds each tree's pcapng capture with that flag (what the
comment costs). --sender measures the sender's rate instead (stats off), as a ratio to
the round's bare run. --point measures fcap at other points than tp_btf/net_dev_queue (raw_tp/net_dev_queue: an
untyped program; the floors stay at tp_btf/net_dev_queue), --filter with a filter (`host 192.0.2.1`: every hit a
reject). A run in which fcap dropped a record is left out (a drop costs less than a record). The
order of the cases rotates from round to round; medians over rounds. Prints markdown. Needs root."""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.capture import POINT, SNAPLEN, Result, Tool, run_one  # noqa: E402
from bench.traffic import BenchError, Sender  # noqa: E402

PAYLOAD = 64

# runs fcap from the tree in argv[1] with bpf_ktime_get_ns emitted as `r0 = 1` (every fcap module's `call`)
ABLATE = r"""
import importlib, pkgutil, sys
sys.path.insert(0, sys.argv.pop(1))
import bpf.asm as a
from bpf.uapi import Helper
import fcap.kernel
for m in pkgutil.iter_modules(fcap.kernel.__path__):
    importlib.import_module("fcap.kernel." + m.name)
import fcap.commands.cli as cli
real = a.call
keep = sys.argv.pop(1) == "keep"      # keep the call, its value dropped (the reader sees what it sees without it)
def call(h):
    if h != Helper.ktime_get_ns:
        return real(h)
    return [real(h), a.movi(a.R0, 1)] if keep else a.movi(a.R0, 1)
for m in list(sys.modules.values()):
    if getattr(m, "__name__", "").startswith("fcap.") and getattr(m, "call", None) is real:
        m.call = call
sys.argv[0] = "fcap"
cli.run()
"""


class Floor:
    """A program at POINT that is empty or only reads the clock, loaded and attached here for one run."""

    def __init__(self, clock: bool):
        self.clock = clock
        self.name = "clock only (bpf_ktime_get_ns)" if clock else "empty program"

    def run(self, sender: Sender, count: int, stats: bool) -> Result:
        from bpf import asm
        from bpf.link import attach_tracing
        from bpf.prog import load
        from bpf.sys import enable_stats
        from bpf.uapi import AttachType, Helper, ProgType
        from fcap.points.spec import resolve
        from bench.bpf_runtime import totals
        pt = resolve(POINT)
        code = ([asm.call(Helper.ktime_get_ns)] if self.clock else []) + [asm.movi(asm.R0, 0), asm.exit_()]
        prog = load(ProgType.TRACING, code, name="fcap_floor", expected_attach_type=AttachType.TRACE_RAW_TP,
                    attach_btf_id=pt.btf_id, what=self.name)
        r = Result(self.name, PAYLOAD, 0)
        try:
            with attach_tracing(prog.fileno(), POINT):
                if stats:
                    with enable_stats():
                        before = totals([prog.fd])
                        s = sender.send(PAYLOAD, count)
                        after = totals([prog.fd])
                    r.bpf_hits = after[1] - before[1]
                    r.bpf_ns_per_hit = (after[0] - before[0]) / r.bpf_hits if r.bpf_hits else None
                else:
                    s = sender.send(PAYLOAD, count)
        finally:
            prog.close()
        r.sent, r.sender_pps, r.dropped = s.packets, s.pps, 0
        return r


ABLATIONS = {"const": ", clock a constant", "keep": ", clock read, its value a constant"}
NO_COMMENT = "--no-comment"


def fcap_tool(name: str, tree: str, fmt: str, ablate: str = "", point: str = POINT, filt: str | None = None) -> Tool:
    args = ["-i", point, "-s", str(SNAPLEN), "-w", "FILE"] + ([filt] if filt else [])
    if ablate == NO_COMMENT:
        args, ablate, name = [NO_COMMENT] + args, "", f"{name} {NO_COMMENT}"
    if point != POINT:
        name = f"{name} {point}"
    if ablate:
        argv = [sys.executable, "-c", ABLATE, tree, ablate] + args
    else:
        argv = ["env", f"PYTHONPATH={tree}", sys.executable, "-m", "fcap.commands.cli"] + args
    return Tool(f"{name} {fmt}" + ABLATIONS.get(ablate, ""), argv, "." + fmt)


def cases(trees: list[tuple[str, str]], ablate: list, sender_mode: bool, formats=("pcap", "pcapng"),
          points=(POINT,), filt: str | None = None) -> list:
    out: list = [None] if sender_mode else []          # None: the bare sender
    out += [Floor(False), Floor(True)]
    for point in points:
        for name, tree in trees:
            for fmt in formats:
                out.append(fcap_tool(name, tree, fmt, "", point, filt))
                out += [fcap_tool(name, tree, fmt, k, point, filt) for k in ablate
                        if k != NO_COMMENT or fmt == "pcapng"]
    return out


def one(sender: Sender, case, count: int, stats: bool) -> Result:
    if case is None:
        return run_one(sender, None, PAYLOAD, count)
    if isinstance(case, Floor):
        return case.run(sender, count, stats)
    return run_one(sender, case, PAYLOAD, count, settle=0.3, bpf_stats=stats)


def measure(trees, rounds: int, count: int, ablate: list, sender_mode: bool, log,
            formats=("pcap", "pcapng"), points=(POINT,), filt: str | None = None) -> tuple[list, dict, dict, list]:
    """Per case name: the per-hit times (or the sender's ratios to its round's bare run), the sender's rates; the
    load average at each round's start."""
    todo = cases(trees, ablate, sender_mode, formats, points, filt)
    names = ["bare sender" if c is None else c.name for c in todo]
    got: dict[str, list[float]] = {n: [] for n in names}
    rates: dict[str, list[float]] = {n: [] for n in names}   # sender mode: each run's pps
    loads = []
    sender = Sender()
    try:
        for k in range(rounds):
            loads.append(os.getloadavg()[0])
            order = list(range(len(todo)))
            order = order[k % len(order):] + order[:k % len(order)]
            round_vals: dict[str, float] = {}
            for i in order:
                r = one(sender, todo[i], count, not sender_mode)
                if r.dropped:
                    log(f"  round {k + 1} {names[i]}: {r.dropped} dropped, left out")
                    continue
                round_vals[names[i]] = r.sender_pps if sender_mode else r.bpf_ns_per_hit
                rates[names[i]].append(r.sender_pps)
                log(f"  round {k + 1} {names[i]}: " + (f"{r.sender_pps / 1000:.0f} kpps" if sender_mode
                                                       else f"{r.bpf_ns_per_hit:.1f} ns/hit ({r.bpf_hits} hits)"))
            bare = round_vals.get("bare sender")
            for n, v in round_vals.items():
                if sender_mode:
                    if bare and n != "bare sender":
                        got[n].append(v / bare)
                else:
                    got[n].append(v)
    finally:
        sender.close()
    return names, got, rates, loads


def upper_quartile(v: list[float]) -> float:
    return statistics.quantiles(v, n=4)[2] if len(v) > 1 else v[0]


def table(names, got, rates, loads, sender_mode: bool, count: int, filt: str | None = None) -> str:
    med = {n: statistics.median(v) for n, v in got.items() if v}
    lo = f"load {min(loads):.1f}–{max(loads):.1f}" if loads else ""
    head = (f"{len(loads)} interleaved rounds, {count:,} × {PAYLOAD}-byte datagrams per run at `{POINT}` (unless "
            f"named), -s {SNAPLEN}{f', filter {filt!r}' if filt else ''}, {lo}, kernel {os.uname().release}:\n\n")
    if sender_mode:
        # a run slowed by other work on the machine only ever lowers a rate: the upper quartiles' ratio is the
        # steadier figure
        bare = upper_quartile(rates["bare sender"]) if rates.get("bare sender") else None
        rows = [f"| attached | sender vs bare: median of the rounds' ratios (range) | upper quartiles' ratio "
                f"(bare: {bare / 1000 if bare else 0:.0f} kpps) | rounds |", "|---|---|---|---|"]
        for n in names[1:]:
            v = got[n]
            if v:
                uq = f"{upper_quartile(rates[n]) / bare:.3f}" if bare else ""
                rows.append(f"| {n} | {med[n]:.3f} ({min(v):.3f}–{max(v):.3f}) | {uq} | {len(v)} |")
        return head + "\n".join(rows)
    clock = med.get("clock only (bpf_ktime_get_ns)")
    empty = med.get("empty program")
    rows = ["| program | ns per hit (median, range) | own: less the clock-only program | less the empty program "
            "| rounds |", "|---|---|---|---|---|"]
    for n in names:
        v = got[n]
        if not v:
            rows.append(f"| {n} | (every run dropped) | | | 0 |")
            continue
        bare = n in ("empty program", "clock only (bpf_ktime_get_ns)")
        own = f"{med[n] - clock:.1f}" if clock is not None and not bare else ""
        net = f"{med[n] - empty:.1f}" if empty is not None and n != "empty program" else ""
        rows.append(f"| {n} | {med[n]:.1f} ({min(v):.1f}–{max(v):.1f}) | {own} | {net} | {len(v)} |")
    return head + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.own_cost", description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000, help="datagrams per run (default 200000)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--tree", action="append", metavar="NAME=PATH",
                    help="a checkout of fcap to measure (repeatable; default: this one, as 'fcap')")
    ap.add_argument("--ablate", action="append", choices=list(ABLATIONS), default=[],
                    help="also each tree with the clock a constant (const), or read and its value a constant (keep)")
    ap.add_argument(NO_COMMENT, dest="no_comment", action="store_true",
                    help="also each tree's pcapng capture with --no-comment")
    ap.add_argument("--sender", action="store_true", help="the sender's rate against bare instead of BPF time")
    ap.add_argument("--format", action="append", choices=("pcap", "pcapng"),
                    help="only this file format (repeatable; default both)")
    ap.add_argument("--point", action="append", help=f"fcap at this point (repeatable; default {POINT})")
    ap.add_argument("--filter", help="fcap with this filter (e.g. 'host 192.0.2.1': every hit a reject)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.own_cost: needs root", file=sys.stderr)
        return 2
    trees = [tuple(t.split("=", 1)) for t in a.tree] if a.tree else [("fcap", ROOT)]
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    try:
        cases_ = a.ablate + [NO_COMMENT] * a.no_comment
        names, got, rates, loads = measure(trees, a.rounds, a.n, cases_, a.sender, log,
                                           a.format or ("pcap", "pcapng"), a.point or (POINT,), a.filter)
    except BenchError as e:
        print(f"bench.own_cost: {e}", file=sys.stderr)
        return 1
    print(table(names, got, rates, loads, a.sender, a.n, a.filter))
    return 0


if __name__ == "__main__":
    sys.exit(main())
