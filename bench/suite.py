"""The benchmark's parts (flood, rate sweep, BPF run time, start-up) run against tcpdump, and the report they make."""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from . import capture, ceiling, report
from .capture import POINT, SNAPLEN, Result, Tool, fcap_argv, run_one, tools
from .startup import interpreter_time, list_devices, ready_times
from .traffic import Sender

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("flood", "disk", "sweep", "bpf", "startup", "ceiling")


def plan(quick: bool) -> dict:
    if quick:
        return dict(payloads=[64, 1400], count=300_000, reps=1, sweep_payloads=[64], rates=[100_000],
                    sweep_count=150_000, ready=3, listing=3, bpf_runtime=["-n", "50000", "--reps", "1"])
    return dict(payloads=[64, 1400], count=1_000_000, reps=3, sweep_payloads=[64, 1400],
                rates=[50_000, 100_000, 200_000, 300_000], sweep_count=300_000, ready=7, listing=5,
                bpf_runtime=["-n", "200000", "--reps", "3"])


def median(rs: list[Result]) -> Result:
    """A result whose numbers are the medians of several runs of one configuration."""
    m = Result(rs[0].tool, rs[0].payload, rs[0].rate)
    for name in ("sent", "sender_pps", "in_file", "cpu_run_s", "cpu_start_s", "ready_s"):
        setattr(m, name, statistics.median(getattr(r, name) for r in rs))
    for name in ("captured", "received", "dropped", "bpf_ns_per_hit", "bpf_hits"):
        vals = [getattr(r, name) for r in rs if getattr(r, name) is not None]
        setattr(m, name, statistics.median(vals) if vals else None)
    m.notes = [n for r in rs for n in r.notes]
    return m


def rounds(sender: Sender, configs: dict, payload: int, rate: float, count: int, reps: int, log) -> list[Result]:
    by_tool: dict[str, list[Result]] = {}
    names = list(configs)
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)]   # rotate: drift hits every tool alike
        for name in order:
            r = run_one(sender, configs[name], payload, count, rate, batch=32 if rate == 0 else 8)
            by_tool.setdefault(name, []).append(r)
            log(f"  {payload:>5} B {'full' if not rate else f'{rate / 1000:.0f}k'} {name:<12} "
                f"{r.sender_pps / 1000:7.1f} kpps  in file {r.share * 100:6.2f}%  "
                f"cpu {r.cpu_us_per_pkt or 0:5.2f} us/pkt  dropped {r.dropped}")
    return [median(by_tool[n]) for n in names]


def compile_checkout() -> None:
    """Byte-compile the checkout's packages, as `pip install` does (this environment may forbid writing .pyc, and
    compiling every module at each start is not what users see)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "fcap"), os.path.join(ROOT, "bpf")],
                   stdout=subprocess.DEVNULL, check=False)


def _bpf_runtime(args: list[str], log) -> str | None:
    """The table of bench/bpf_runtime.py (another engineer's), when it is there."""
    if not os.path.exists(os.path.join(ROOT, "bench", "bpf_runtime.py")):
        return None
    log("python -m bench.bpf_runtime " + " ".join(args))
    r = subprocess.run([sys.executable, "-m", "bench.bpf_runtime", *args], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        log(f"  bench.bpf_runtime failed: {r.stderr.strip()[-300:]}")
        return None
    return r.stdout


@dataclass
class Runs:
    """What the parts measured, as report.report() takes it."""

    plan: dict
    tools: dict[str, Tool]
    other_fcap: bool                  # fcap run as another command (--fcap): no bench.bpf_runtime table
    disk_dir: str = "/var/tmp"        # where the "disk" part's files go
    full: list[list[Result]] = field(default_factory=list)
    disk: list[list[Result]] = field(default_factory=list)
    sweep: list[list[Result]] = field(default_factory=list)
    bpf: list[Result] = field(default_factory=list)
    bpf_runtime: str | None = None
    ready: dict = field(default_factory=dict)
    listing: dict = field(default_factory=dict)
    ceiling: list = field(default_factory=list)


def _floods(sender: Sender, runs: Runs, log) -> list[list[Result]]:
    """Every payload at full speed, plan["reps"] rounds each, files in capture.OUT_DIR."""
    plan = runs.plan
    return [rounds(sender, {"none": None, **runs.tools}, payload, 0, plan["count"], plan["reps"], log)
            for payload in plan["payloads"]]


def _flood(sender: Sender, runs: Runs, log) -> None:
    log(f"flood at full speed ({runs.plan['count']:,} datagrams, {runs.plan['reps']} round(s))")
    runs.full = _floods(sender, runs, log)


def _disk(sender: Sender, runs: Runs, log) -> None:
    """The flood again, the files on a disk file system: what a user's `-w out.pcap` costs (the page cache's cost
    per byte, and so each tool's, depends on the file system and the size of the writes)."""
    kept = capture.OUT_DIR[0]
    log(f"flood at full speed, files in {runs.disk_dir} ({report.fs_type(runs.disk_dir)})")
    capture.OUT_DIR[0] = runs.disk_dir
    try:
        runs.disk = _floods(sender, runs, log)
    finally:
        capture.OUT_DIR[0] = kept


def _sweep(sender: Sender, runs: Runs, log) -> None:
    plan = runs.plan
    log(f"rate sweep ({plan['sweep_count']:,} datagrams)")
    for payload in plan["sweep_payloads"]:
        for rate in plan["rates"]:
            runs.sweep.append(rounds(sender, {"none": None, **runs.tools}, payload, rate, plan["sweep_count"], 1,
                                     log))


def _bpf(sender: Sender, runs: Runs, log) -> None:
    log("BPF run time (stats on)")
    for payload in runs.plan["payloads"]:
        for name in ("fcap pcap", "fcap pcapng"):
            r = run_one(sender, runs.tools[name], payload, runs.plan["sweep_count"], bpf_stats=True)
            runs.bpf.append(r)
            log(f"  {payload:>5} B {name:<12} {r.bpf_ns_per_hit or 0:.0f} ns/run over {r.bpf_hits} runs")
    if not runs.other_fcap:
        runs.bpf_runtime = _bpf_runtime(runs.plan["bpf_runtime"], log)


def _startup(sender: Sender, runs: Runs, log) -> None:
    log("start-up")
    if not runs.other_fcap:
        runs.listing["python"] = interpreter_time(runs.plan["ready"])
    for name in ("tcpdump", "fcap pcap", "fcap pcap cold"):
        runs.ready[name] = ready_times(runs.tools[name.removesuffix(" cold")], runs.plan["ready"],
                                       cold=name.endswith(" cold"))
        log(f"  {name:<14} ready in {statistics.median(runs.ready[name]):.3f} s")
    runs.listing.update(list_devices(fcap_argv(), runs.plan["listing"]))
    log(f"  list-devices {runs.listing['fcap']:.3f} s (cold {runs.listing['fcap cold']:.3f} s), bpftool btf dump "
        f"{runs.listing['bpftool'] or 0:.3f} s")


def _ceiling(sender: Sender, runs: Runs, log) -> None:
    log("the drain's ceiling (rings filled while fcap is stopped)")
    runs.ceiling = ceiling.run(sender, runs.plan["reps"], log)


_PART = {"flood": _flood, "disk": _disk, "sweep": _sweep, "bpf": _bpf, "startup": _startup, "ceiling": _ceiling}


def run(args, log) -> int:
    """The parts args.only names (all by default) with args.quick's plan; the report printed (args.no_write,
    args.only) or written into args.out, every run's numbers into args.json. Raises BenchError."""
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t_start = time.monotonic()
    runs = Runs(plan(args.quick), tools(), bool(args.fcap), disk_dir=args.disk_dir)
    sender = Sender()
    try:
        for name in PARTS:
            if name in (args.only or PARTS):
                _PART[name](sender, runs, log)
    finally:
        sender.close()
    took = time.monotonic() - t_start
    cmd = "python -m bench" + (" --quick" if args.quick else "")
    text = report.report(cmd, runs.plan, runs.full, runs.sweep, runs.bpf, runs.bpf_runtime, runs.ready, runs.listing,
                         started, took, ceiling=ceiling.table(runs.ceiling) if runs.ceiling else None,
                         disk=(runs.disk_dir, runs.disk))
    if args.json:
        _write_json(args.json, runs, started, args.quick)
    if args.no_write or args.only:
        print(text)
    else:
        report.write_section(args.out, text)
        log(f"wrote {args.out} ({took:.0f} s)")
    return 0


def _write_json(path: str, runs: Runs, started: str, quick: bool) -> None:
    results = [r for res in runs.full + runs.disk + runs.sweep for r in res] + runs.bpf
    with open(path, "w") as f:
        json.dump({"started": started, "quick": quick, "point": POINT, "snaplen": SNAPLEN,
                   "runs": [asdict(r) for r in results], "ready": runs.ready, "listing": runs.listing,
                   "ceiling": [asdict(c) for c in runs.ceiling]}, f, indent=1)
