"""python -m bench [--quick]: fcap against tcpdump on the same loopback flood; rewrites BENCHMARKS.md's tables."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict

from . import capture, report
from .capture import POINT, SNAPLEN, Result, fcap_argv, run_one, tools
from .startup import list_devices, ready_times
from .traffic import BenchError, Sender

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _plan(quick: bool) -> dict:
    if quick:
        return dict(payloads=[64, 1400], count=300_000, reps=1, sweep_payloads=[64], rates=[100_000],
                    sweep_count=150_000, ready=3, listing=3, bpf_runtime=["-n", "50000", "--reps", "1"])
    return dict(payloads=[64, 1400], count=1_000_000, reps=3, sweep_payloads=[64, 1400],
                rates=[50_000, 100_000, 200_000, 300_000], sweep_count=300_000, ready=7, listing=5,
                bpf_runtime=["-n", "200000", "--reps", "3"])


def _median(rs: list[Result]) -> Result:
    """A result whose numbers are the medians of several runs of one configuration."""
    m = Result(rs[0].tool, rs[0].payload, rs[0].rate)
    for name in ("sent", "sender_pps", "in_file", "cpu_run_s", "cpu_start_s", "ready_s"):
        setattr(m, name, statistics.median(getattr(r, name) for r in rs))
    for name in ("captured", "received", "dropped", "bpf_ns_per_hit", "bpf_hits"):
        vals = [getattr(r, name) for r in rs if getattr(r, name) is not None]
        setattr(m, name, statistics.median(vals) if vals else None)
    m.notes = [n for r in rs for n in r.notes]
    return m


def _rounds(sender: Sender, configs: dict, payload: int, rate: float, count: int, reps: int, log) -> list[Result]:
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
    return [_median(by_tool[n]) for n in names]


def _compile() -> None:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer packets and runs: under two minutes")
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"), help="the report (default: BENCHMARKS.md)")
    ap.add_argument("--no-write", action="store_true", help="print the report, leave BENCHMARKS.md alone")
    ap.add_argument("--json", metavar="FILE", help="also write every run's numbers as JSON")
    ap.add_argument("--only", choices=("flood", "sweep", "bpf", "startup"), action="append",
                    help="run only these parts (repeatable; implies --no-write)")
    ap.add_argument("--fcap", metavar="CMD", help="run fcap as CMD (e.g. 'env PYTHONPATH=/tmp/old python3 -m "
                    "fcap.cli', to measure another version; implies --no-write)")
    ap.add_argument("--levers", action="store_true",
                    help="measure fcap as of each fast-path lever's commit (bench/levers.py) and rewrite that table")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench: needs root (tcpdump and fcap capture)", file=sys.stderr)
        return 2
    if args.fcap:
        capture.FCAP[:] = shlex.split(args.fcap)
        args.no_write = True

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    _compile()
    if args.levers:
        return _levers(args, log)
    plan = _plan(args.quick)
    parts = set(args.only or ("flood", "sweep", "bpf", "startup"))
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t_start = time.monotonic()
    t = tools()
    configs = {"none": None, **t}
    full, sweep, bpf = [], [], []
    ready, listing, bpf_runtime = {}, {}, None
    try:
        sender = Sender()
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    try:
        if "flood" in parts:
            log(f"flood at full speed ({plan['count']:,} datagrams, {plan['reps']} round(s))")
            for payload in plan["payloads"]:
                full.append(_rounds(sender, configs, payload, 0, plan["count"], plan["reps"], log))
        if "sweep" in parts:
            log(f"rate sweep ({plan['sweep_count']:,} datagrams)")
            for payload in plan["sweep_payloads"]:
                for rate in plan["rates"]:
                    sweep.append(_rounds(sender, configs, payload, rate, plan["sweep_count"], 1, log))
        if "bpf" in parts:
            log("BPF run time (stats on)")
            for payload in plan["payloads"]:
                for name in ("fcap pcap", "fcap pcapng"):
                    r = run_one(sender, t[name], payload, plan["sweep_count"], bpf_stats=True)
                    bpf.append(r)
                    log(f"  {payload:>5} B {name:<12} {r.bpf_ns_per_hit or 0:.0f} ns/run over {r.bpf_hits} runs")
            if not args.fcap:
                bpf_runtime = _bpf_runtime(plan["bpf_runtime"], log)
        if "startup" in parts:
            log("start-up")
            for name in ("tcpdump", "fcap pcap"):
                ready[name] = ready_times(t[name], plan["ready"])
                log(f"  {name:<12} ready in {statistics.median(ready[name]):.3f} s")
            listing = list_devices(fcap_argv(), plan["listing"])
            log(f"  list-devices {listing['fcap']:.3f} s, bpftool btf dump {listing['bpftool'] or 0:.3f} s")
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    finally:
        sender.close()
    took = time.monotonic() - t_start
    cmd = "python -m bench" + (" --quick" if args.quick else "")
    text = report.report(cmd, plan, full, sweep, bpf, bpf_runtime, ready, listing, started, took)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"started": started, "quick": args.quick, "point": POINT, "snaplen": SNAPLEN,
                       "runs": [asdict(r) for res in full + sweep for r in res] + [asdict(r) for r in bpf],
                       "ready": ready, "listing": listing}, f, indent=1)
    if args.no_write or args.only:
        print(text)
    else:
        report.write_section(args.out, text)
        log(f"wrote {args.out} ({took:.0f} s)")
    return 0


def _levers(args, log) -> int:
    from . import levers
    payload, count, reps = 64, 300_000, (1 if args.quick else 3)
    log(f"levers: {len(levers.LEVERS)} revisions, {payload}-byte payloads, {count:,} datagrams, {reps} round(s)")
    try:
        results, bpf = levers.measure(payload, count, reps, log)
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    text = levers.table(results, bpf, payload, count, reps)
    if args.no_write:
        print(text)
    else:
        report.write_section(args.out, text, levers.BEGIN, levers.END)
        log(f"wrote the levers table into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
