"""What each fast-path lever gained: the same flood against fcap as of each lever's commit (`git archive` of the
revision into a temporary directory, run with PYTHONPATH there), with tcpdump and the bare sender in every round."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from . import report
from .capture import Result, Tool, run_one, tools
from .suite import median
from .traffic import Sender

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- bench:levers:begin -->", "<!-- bench:levers:end -->"

# (commit, what it changed); the first is the starting point
LEVERS = [
    ("2d3fdf8", "before: perf buffer, a Record object per packet, writer.write, the comment formatted per packet"),
    ("951ba68", "the program lays out the pcap/pcapng record header; the drain slices samples into os.writev "
                "batches (no per-record objects; pcapng options cached by metadata)"),
    ("e979aaa", "the ring's tail stored with one 8-byte store (struct.pack_into zeroed it first: spurious "
                "full rings, LOST records)"),
    ("282ecee", "pcap: per-CPU file rings, the program writes finished records, user space writes the bytes "
                "(one or two slices per CPU per wake-up, a doorbell at a quarter full)"),
    ("6bcba2f", "leaner program: no pid/comm/mark/netns for pcap, no probe_read for an empty link-header "
                "prefix, the ring's record header written in place"),
    ("f4dae5b", "pcapng: EPBs with options and the metadata comment laid out (and formatted) by the program "
                "in the file rings"),
    ("a1c60f1", "the command exits without the interpreter's teardown (~20 ms of CPU per run)"),
    ("b205f77", "pid/tid and comm read straight from current (get_current_task_btf) instead of two helpers"),
    ("5e52c11", "timestamp and metadata read after the filter (cheaper rejects; same work for a capture)"),
    ("5c03892", "the file ring copies linear bytes with one probe_read_kernel (no dynptr kfunc + helper); the "
                "filter reads in place through skb->head"),
    ("ece7b38", "linear packets up to 256 bytes copied into the ring by direct 8-byte loads (no helper call)"),
    ("d8548c2", "pcap: ts_sec from the second cached in the ring's control words (one division per second)"),
    ("33c76c5", "a published record skips the counters; no device loads a pcap file does not need"),
    ("82dda1a", "file rings: a record published with a store-release of head, not a locked add (6.15+)"),
]


def run(args, log) -> int:
    """python -m bench --levers: measure every lever's revision, then print the table (args.no_write) or rewrite
    it in args.out. Raises BenchError."""
    payload, count, reps = 64, 300_000, (1 if args.quick else 3)
    log(f"levers: {len(LEVERS)} revisions, {payload}-byte payloads, {count:,} datagrams, {reps} round(s)")
    results, bpf = measure(payload, count, reps, log)
    text = table(results, bpf, payload, count, reps)
    if args.no_write:
        print(text)
    else:
        report.write_section(args.out, text, BEGIN, END)
        log(f"wrote the levers table into {args.out}")
    return 0


def checkout(rev: str, into: str) -> str:
    """The tree of `rev` under `into`/rev, byte-compiled; returns its path."""
    path = os.path.join(into, rev)
    os.makedirs(path)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", path], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(path, "fcap"), os.path.join(path, "bpf")],
                   check=True, stdout=subprocess.DEVNULL)
    return path


def _fcap_tools(tree: str, rev: str) -> list[Tool]:
    base = tools()
    cmd = ["env", f"PYTHONPATH={tree}", sys.executable, "-m", "fcap.commands.cli"]
    out = []
    for name in ("fcap pcap", "fcap pcapng"):
        t = base[name]
        i = t.argv.index("-i")
        out.append(Tool(f"{rev} {name.split()[1]}", cmd + t.argv[i:], t.suffix))
    return out


def measure(payload: int, count: int, reps: int, log, levers=LEVERS) -> tuple[list[Result], dict]:
    tmp = tempfile.mkdtemp(prefix="fcap-levers-")
    sender = Sender()
    try:
        configs: dict[str, Tool | None] = {"none": None, "tcpdump": tools()["tcpdump"]}
        for rev, _what in levers:
            for t in _fcap_tools(checkout(rev, tmp), rev):
                configs[t.name] = t
        runs: dict[str, list[Result]] = {}
        names = list(configs)
        for rep in range(reps):
            k = rep * 3 % len(names)
            for name in names[k:] + names[:k]:
                r = run_one(sender, configs[name], payload, count, 0)
                runs.setdefault(name, []).append(r)
                log(f"  {name:<16} {r.sender_pps / 1000:7.1f} kpps  in file {r.share * 100:6.2f}%  "
                    f"cpu {r.cpu_us_per_pkt or 0:5.2f} us/pkt  dropped {r.dropped}")
        bpf = {}
        for name, t in configs.items():
            if t is not None and name != "tcpdump":
                r = run_one(sender, t, payload, count // 2, 0, bpf_stats=True)
                bpf[name] = r.bpf_ns_per_hit
                log(f"  {name:<16} BPF {r.bpf_ns_per_hit or 0:.0f} ns/run")
        return [median(runs[nm]) for nm in names], bpf
    finally:
        sender.close()
        shutil.rmtree(tmp, ignore_errors=True)


def table(results: list[Result], bpf: dict, payload: int, count: int, reps: int, levers=LEVERS) -> str:
    by = {r.tool: r for r in results}
    bare, td = by["none"], by["tcpdump"]
    lines = [BEGIN, "", f"`python -m bench --levers`: {payload}-byte payloads, {count:,} datagrams at full speed, "
             f"medians of {reps} rounds; tcpdump in the same rounds: {pct(td.share)} in file, sender "
             f"{td.sender_pps / bare.sender_pps:.2f} of bare, {td.cpu_us_per_pkt:.2f} µs CPU per packet.", "",
             "| commit | lever | file | in file | dropped | sender vs bare | CPU µs/pkt | CPU vs tcpdump | "
             "BPF ns/run |", "|---|---|---|---|---|---|---|---|---|"]
    for rev, what in levers:
        for fmt in ("pcap", "pcapng"):
            r = by[f"{rev} {fmt}"]
            cpu = r.cpu_us_per_pkt
            ns = bpf.get(r.tool)
            lines.append(f"| {rev} | {what if fmt == 'pcap' else '〃'} | {fmt} | {pct(r.share)} | "
                         f"{'?' if r.dropped is None else int(r.dropped)} | {r.sender_pps / bare.sender_pps:.2f} | "
                         f"{'' if cpu is None else f'{cpu:.2f}'} | "
                         f"{'' if cpu is None else f'{cpu / td.cpu_us_per_pkt:.2f}'} | "
                         f"{'?' if ns is None else f'{ns:.0f}'} |")
    lines += ["", END]
    return "\n".join(lines)


def pct(x: float) -> str:
    return f"{x * 100:.2f}%" if x < 0.99995 else "100%"

