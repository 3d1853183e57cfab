"""python -m bench [--quick]: fcap against tcpdump on the same loopback flood; rewrites BENCHMARKS.md's tables."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict

from . import capture
from .capture import POINT, SNAPLEN, Result, fcap_argv, run_one, tools
from .startup import list_devices, ready_times
from .traffic import CAPTURE_CPU, SENDER_CPU, BenchError, Sender

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
ORDER = ["none", "tcpdump", "fcap pcap", "fcap pcapng"]


def _plan(quick: bool) -> dict:
    if quick:
        return dict(payloads=[64, 1400], count=300_000, reps=1, sweep_payloads=[64], rates=[100_000],
                    sweep_count=150_000, ready=3, listing=3)
    return dict(payloads=[64, 1400], count=1_000_000, reps=3, sweep_payloads=[64, 1400],
                rates=[50_000, 100_000, 200_000, 300_000], sweep_count=300_000, ready=7, listing=5)


def _median(rs: list[Result]) -> Result:
    """A result whose numbers are the medians of several runs of one configuration."""
    m = Result(rs[0].tool, rs[0].payload, rs[0].rate)
    for name in ("sent", "sender_pps", "in_file", "cpu_run_s", "cpu_start_s", "ready_s"):
        setattr(m, name, statistics.median(getattr(r, name) for r in rs))
    for name in ("captured", "received", "dropped", "bpf_ns_per_hit", "bpf_hits"):
        vals = [getattr(r, name) for r in rs if getattr(r, name) is not None]
        setattr(m, name, statistics.median(vals) if vals else None)
    m.notes = [n for r in rs for n in r.notes]
    m.runs = len(rs)
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


def _fmt_pct(x: float) -> str:
    return f"{x * 100:.2f}%" if x < 0.99995 else "100%"


def _table(results: list[Result]) -> list[str]:
    bare = next((r for r in results if r.tool == "none"), None)
    td = next((r for r in results if r.tool == "tcpdump"), None)
    out = ["| capture | in file | missing | dropped (tool says) | captured / received (tool says) | sender kpps | "
           "sender vs bare | CPU µs/pkt | CPU vs tcpdump |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        vs_bare = f"{r.sender_pps / bare.sender_pps:.2f}" if bare and bare.sender_pps else ""
        if r.tool == "none":
            out.append(f"| none | | | | | {r.sender_pps / 1000:.0f} | 1.00 | | |")
            continue
        cpu = r.cpu_us_per_pkt
        vs_td = (f"{cpu / td.cpu_us_per_pkt:.2f}" if cpu and td and td.cpu_us_per_pkt and r is not td else
                 "1.00" if r is td else "")
        out.append(f"| {r.tool} | {_fmt_pct(r.share)} | {int(r.sent - r.in_file)} | {_n(r.dropped)} | "
                   f"{_n(r.captured)} / {_n(r.received)} | {r.sender_pps / 1000:.0f} | {vs_bare} | "
                   f"{cpu:.2f} | {vs_td} |" if cpu is not None else f"| {r.tool} | 0 | | | | | | | |")
    return out


def _n(x) -> str:
    return "?" if x is None else str(int(x))


def _machine() -> list[str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    td = subprocess.run(["tcpdump", "--version"], capture_output=True, text=True).stdout.splitlines()
    load = os.getloadavg()
    return [f"- machine: {cpu}, {os.cpu_count()} CPUs, kernel {platform.release()}, Python "
            f"{platform.python_version()}, {td[0] if td else 'tcpdump ?'}",
            f"- load average when the run started: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
            "(other work on the machine shows up as noise in every column)"]


def _report(args, plan, full: list[list[Result]], sweep: list[list[Result]], bpf: list[Result],
            ready: dict, listing: dict, started: str, took: float) -> str:
    t = tools()
    cmd = "python -m bench" + (" --quick" if args.quick else "")
    lines = [BEGIN, "", f"Made by `{cmd}` on {started} ({took:.0f} s).", ""]
    lines += _machine()
    lines += [f"- traffic: bench/sender.c (sendmmsg, batches of 32 at full speed, 8 in the sweep) on CPU "
              f"{SENDER_CPU}, UDP to a sink socket on 127.0.0.1 that the sender reads back; the capture process "
              f"on CPU {CAPTURE_CPU} (taskset), files on /dev/shm",
              "- commands: " + "; ".join(f"`{tl.shown()}`" for tl in t.values()),
              f"- in file: the sender's datagrams found in the file (distinct sequence numbers); missing = sent − "
              "in file; CPU: the capture process's user+sys from `listening on` to exit (wait4), per datagram in "
              f"the file; medians of {plan['reps']} run(s), tools run in rotating order", ""]
    lines += ["## Flood at full speed", ""]
    for res in full:
        r0 = res[0]
        lines += [f"### {r0.payload}-byte payloads, {int(r0.sent):,} datagrams", ""] + _table(res) + [""]
    if sweep:
        lines += ["## Rate sweep", "",
                  "| payload | rate asked | capture | in file | dropped (tool says) | sender vs bare | CPU µs/pkt |",
                  "|---|---|---|---|---|---|---|"]
        for res in sweep:
            bare = next(r for r in res if r.tool == "none")
            for r in res:
                if r.tool == "none":
                    continue
                lines.append(f"| {r.payload} B | {r.rate / 1000:.0f} kpps | {r.tool} | {_fmt_pct(r.share)} | "
                             f"{_n(r.dropped)} | {r.sender_pps / bare.sender_pps:.2f} | "
                             f"{r.cpu_us_per_pkt or 0:.2f} |")
        lines.append("")
    if bpf:
        lines += ["## BPF run time per hit", "",
                  "Kernel run-time stats (BPF_ENABLE_STATS) while fcap captures the full-speed flood (a separate "
                  "run: the stats cost time of their own).", "",
                  "| capture | payload | program runs | ns per run |", "|---|---|---|---|"]
        for r in bpf:
            lines.append(f"| {r.tool} | {r.payload} B | {_n(r.bpf_hits)} | "
                         f"{'?' if r.bpf_ns_per_hit is None else f'{r.bpf_ns_per_hit:.0f}'} |")
        lines.append("")
    lines += ["## Start-up", "", "| | fcap | tcpdump / bpftool | ratio |", "|---|---|---|---|"]
    f, td = ready.get("fcap pcap"), ready.get("tcpdump")
    if f and td:
        lines.append(f"| exec to `listening on` (median of {len(f)}) | {statistics.median(f):.3f} s | "
                     f"{statistics.median(td):.3f} s | {statistics.median(f) / statistics.median(td):.1f} |")
    if listing.get("bpftool"):
        lines.append(f"| `fcap list-devices` vs `bpftool btf dump file /sys/kernel/btf/vmlinux` (median of "
                     f"{plan['listing']}) | {listing['fcap']:.3f} s | {listing['bpftool']:.3f} s | "
                     f"{listing['fcap'] / listing['bpftool']:.2f} |")
    elif listing.get("fcap"):
        lines.append(f"| `fcap list-devices` | {listing['fcap']:.3f} s | (no bpftool) | |")
    notes = [n for res in full + sweep for r in res for n in r.notes]
    if notes:
        lines += ["", "Notes: " + "; ".join(notes)]
    lines += ["", END]
    return "\n".join(lines)


def _write(path: str, section: str) -> None:
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = "# Benchmarks\n\n" + BEGIN + "\n" + END + "\n"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        new = head + section + tail
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(new)


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
    args = ap.parse_args(argv)
    if args.fcap:
        import shlex
        capture.FCAP[:] = shlex.split(args.fcap)
        args.no_write = True
    if os.geteuid() != 0:
        print("bench: needs root (tcpdump and fcap capture)", file=sys.stderr)
        return 2
    plan = _plan(args.quick)
    parts = set(args.only or ("flood", "sweep", "bpf", "startup"))
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t = tools()
    configs = {"none": None, **t}
    full, sweep, bpf = [], [], []
    ready, listing = {}, {}
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
    report = _report(args, plan, full, sweep, bpf, ready, listing, started, took)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"started": started, "quick": args.quick, "point": POINT, "snaplen": SNAPLEN,
                       "runs": [asdict(r) for res in full + sweep for r in res] + [asdict(r) for r in bpf],
                       "ready": ready, "listing": listing}, f, indent=1)
    if args.no_write or args.only:
        print(report)
    else:
        _write(args.out, report)
        log(f"wrote {args.out} ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
