"""BENCHMARKS.md: the tables the runs make, the machine, and the rewrite of the marked sections only."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess

from . import capture
from .capture import Result, tools
from .traffic import CAPTURE_CPU, RT_PRIORITY, SENDER_CPU

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def pct(x: float) -> str:
    return f"{x * 100:.2f}%" if x < 0.99995 else "100%"


def n(x) -> str:
    return "?" if x is None else str(int(x))


def flood_table(results: list[Result]) -> list[str]:
    bare = next((r for r in results if r.tool == "none"), None)
    td = next((r for r in results if r.tool == "tcpdump"), None)
    dc = next((r for r in results if r.tool == "dumpcap"), None)
    out = ["| capture | in file | missing | dropped (tool says) | captured / received (tool says) | sender kpps | "
           "sender vs bare | CPU µs/pkt | CPU vs tcpdump | CPU vs dumpcap |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.tool == "none":
            out.append(f"| none | | | | | {r.sender_pps / 1000:.0f} | 1.00 | | | |")
            continue
        vs_bare = f"{r.sender_pps / bare.sender_pps:.2f}" if bare and bare.sender_pps else ""
        cpu = r.cpu_us_per_pkt
        if cpu is None:
            out.append(f"| {r.tool} | 0 | {int(r.sent)} | {n(r.dropped)} | | | {vs_bare} | | | |")
            continue
        out.append(f"| {r.tool} | {pct(r.share)} | {int(r.sent - r.in_file)} | {n(r.dropped)} | "
                   f"{n(r.captured)} / {n(r.received)} | {r.sender_pps / 1000:.0f} | {vs_bare} | {cpu:.2f} | "
                   f"{_ratio(cpu, td)} | {_ratio(cpu, dc)} |")
    return out


def _ratio(cpu: float, other: Result | None) -> str:
    return f"{cpu / other.cpu_us_per_pkt:.2f}" if other is not None and other.cpu_us_per_pkt else ""


def sweep_table(sweep: list[list[Result]]) -> list[str]:
    out = ["| payload | rate asked | capture | in file | dropped (tool says) | sender vs bare | CPU µs/pkt |",
           "|---|---|---|---|---|---|---|"]
    for res in sweep:
        bare = next(r for r in res if r.tool == "none")
        for r in res:
            if r.tool == "none":
                continue
            out.append(f"| {r.payload} B | {r.rate / 1000:.0f} kpps | {r.tool} | {pct(r.share)} | {n(r.dropped)} | "
                       f"{r.sender_pps / bare.sender_pps:.2f} | {r.cpu_us_per_pkt or 0:.2f} |")
    return out


def machine() -> list[str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        td = subprocess.run(["tcpdump", "--version"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        td = []
    load = os.getloadavg()
    return [f"- machine: {cpu}, {os.cpu_count()} CPUs (a KVM guest), kernel {platform.release()}, Python "
            f"{platform.python_version()}, {td[0] if td else 'tcpdump ?'}",
            f"- load average when the run started: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other work on the "
            "machine; the runs are SCHED_FIFO so it waits, but it still shares the host)"]


def startup_table(plan: dict, ready: dict, listing: dict) -> list[str]:
    """exec to `listening on` (warm and cold) against tcpdump; list-devices (warm and cold) against bpftool."""
    lines: list[str] = []
    lines += ["### Start-up", "", "| | fcap | tcpdump / bpftool | ratio |", "|---|---|---|---|"]
    f, td, fc = ready.get("fcap pcap"), ready.get("tcpdump"), ready.get("fcap pcap cold")
    if f and td:
        lines.append(f"| exec to `listening on` (median of {len(f)}) | {statistics.median(f):.3f} s | "
                     f"{statistics.median(td):.3f} s | {statistics.median(f) / statistics.median(td):.1f} |")
    if fc and td:
        lines.append(f"| exec to `listening on`, cold: no per-boot BTF cache yet (median of {len(fc)}) | "
                     f"{statistics.median(fc):.3f} s | {statistics.median(td):.3f} s | "
                     f"{statistics.median(fc) / statistics.median(td):.1f} |")
    if listing.get("python"):
        lines.append(f"| the interpreter alone: `python3 -c pass`, this environment's site hooks included | "
                     f"{listing['python']:.3f} s | | |")
    what = f"`fcap list-devices` vs `bpftool btf dump file /sys/kernel/btf/vmlinux` (median of {plan['listing']})"
    for key, label in (("fcap", ""), ("fcap cold", ", cold")):
        if listing.get(key) is None:
            continue
        if listing.get("bpftool"):
            lines.append(f"| {what}{label} | {listing[key]:.3f} s | {listing['bpftool']:.3f} s | "
                         f"{listing[key] / listing['bpftool']:.2f} |")
        else:
            lines.append(f"| `fcap list-devices`{label} | {listing[key]:.3f} s | (no bpftool) | |")
    lines.append("")
    return lines


def fs_type(path: str) -> str:
    """The type of the file system path is on (the longest mount point above it in /proc/self/mounts)."""
    path, best, kind = os.path.realpath(path), "", "?"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                mnt = fields[1]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, fields[2]
    except OSError:
        pass
    return kind


def disk_section(where: str, disk: list[list[Result]]) -> list[str]:
    lines = [f"### Flood at full speed, files on a disk file system ({where}: {fs_type(where)})", "",
             "The same flood, the files where a user's `-w out.pcap` goes. The kernel's write path costs each tool "
             "per byte differently than tmpfs does (fcap writes ~0.5 MB per system call, tcpdump its stdio buffer's "
             "4 KiB). The page cache's writeback to the disk happens later in kernel threads, counted for neither "
             "tool, in proportion to the bytes each writes.", ""]
    for res in disk:
        lines += [f"#### {res[0].payload}-byte payloads, {int(res[0].sent):,} datagrams", ""]
        lines += flood_table(res) + [""]
    return lines


def report(cmd: str, plan: dict, full, sweep, bpf, bpf_runtime: str | None, ready: dict, listing: dict,
           started: str, took: float, ceiling: list[str] | None = None, disk: tuple = ("", [])) -> str:
    t = tools()
    rt = f"SCHED_FIFO {RT_PRIORITY}, " if RT_PRIORITY else ""
    lines = [BEGIN, "", f"Made by `{cmd}` on {started} ({took:.0f} s).", ""]
    lines += machine()
    lines += [f"- traffic: bench/sender.c (sendmmsg, batches of 32 at full speed, 8 in the sweep) on CPU "
              f"{SENDER_CPU}, UDP to a sink socket on 127.0.0.1 that the sender reads back; the capture process "
              f"on CPU {CAPTURE_CPU} ({rt}taskset), files in {capture.OUT_DIR[0]}; fcap's Python byte-compiled "
              "first (as pip install does)",
              "- commands: " + "; ".join(f"`{tl.shown()}`" for tl in t.values()),
              "- in file: the sender's datagrams found in the file (distinct sequence numbers); missing = sent − in "
              "file; dropped, captured, received: the tool's own summary lines; CPU: the capture process's user+sys "
              f"from `listening on` to exit (wait4), per datagram in the file; medians of {plan['reps']} run(s), "
              "tools in rotating order", ""]
    if full:
        lines += ["### Flood at full speed", ""]
        for res in full:
            lines += [f"#### {res[0].payload}-byte payloads, {int(res[0].sent):,} datagrams", ""]
            lines += flood_table(res) + [""]
    if disk[1]:
        lines += disk_section(*disk)
    if sweep:
        lines += ["### Rate sweep", ""] + sweep_table(sweep) + [""]
    if bpf:
        lines += ["### BPF run time per hit", "",
                  "During the full-speed flood, per output format (kernel run-time stats, BPF_ENABLE_STATS, in a run "
                  "of its own: the stats cost time too; an empty program measures about 60 ns here).", "",
                  "| capture | payload | program runs | ns per run |", "|---|---|---|---|"]
        for r in bpf:
            lines.append(f"| {r.tool} | {r.payload} B | {n(r.bpf_hits)} | "
                         f"{'?' if r.bpf_ns_per_hit is None else f'{r.bpf_ns_per_hit:.0f}'} |")
        lines.append("")
    if bpf_runtime:
        lines += ["From `python -m bench.bpf_runtime` (its own sender and cases):", "", bpf_runtime.strip(), ""]
    if ready or listing:
        lines += startup_table(plan, ready, listing)
    if ceiling:
        lines += ceiling
    notes = [note for res in full + disk[1] + sweep for r in res for note in r.notes]
    if notes:
        lines += ["Notes: " + "; ".join(notes), ""]
    lines.append(END)
    return "\n".join(lines)


def write_section(path: str, section: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace the text between the markers (the markers included) with `section`; append it when absent."""
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = "# Benchmarks\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + section + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(new)
