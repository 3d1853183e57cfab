"""python -m bench.flood: several CPUs sending at once. N senders (bench/sender.c), each pinned to its own CPU
and sending COUNT 64-byte datagrams at full speed to a sink of its own on 127.0.0.1, bare and under each capture
tool (tcpdump -i lo, dumpcap, fcap pcap, fcap pcapng) in one run; per N: the share of the datagrams in each tool's
file, the senders' aggregate rate against bare, and the tool's CPU per captured datagram (from `listening on` to its
exit, less an idle run's). The reader has a CPU of
its own (the last) while the senders leave one; on a machine with fewer CPUs than that, senders take every CPU
and the reader shares them, as on a 2-CPU laptop."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from .capture import SNAPLEN, Result, Tool, _proc_cpu_s, _summary, count_in_file, running, tools
from .traffic import BenchError, Sender

PAYLOAD = 64
SETTLE_S = 1.0


@dataclass
class FloodResult(Result):
    """A flood's run: Result's numbers (CPU from `listening on` to exit, less an idle run's) for N senders."""

    senders: int = 1

    @property
    def cpu_ns_per_pkt(self) -> float | None:
        return self.cpu_run_s * 1e9 / self.in_file if self.in_file else None


def cpus_for(senders: int) -> tuple[list[int], int | None]:
    """The senders' CPUs and the reader's (None: it shares theirs)."""
    cpus = sorted(os.sched_getaffinity(0))
    if senders < len(cpus):
        return cpus[:senders], cpus[-1]
    return [cpus[i % len(cpus)] for i in range(senders)], None


def _send_all(sender: Sender, cpus: list[int], count: int) -> tuple[int, float, set]:
    """The senders started together, one per CPU; (datagrams sent, their rates added up, the sinks' ports)."""
    procs = [subprocess.Popen(["taskset", "-c", str(c), sender.path, str(PAYLOAD), str(count), "0", "32"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cpus]
    sent, pps, ports = 0, 0.0, set()
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise BenchError(f"sender failed: {err.strip()}")
        f = out.split()
        n, ns = int(f[1]), int(f[3])
        sent += n
        pps += n * 1e9 / ns if ns else 0.0
        ports.add(int(f[5]))
    return sent, pps, ports


def run_one(sender: Sender, tool: Tool | None, senders: int, count: int, where: str) -> FloodResult:
    cpus, reader = cpus_for(senders)
    r = FloodResult(tool.name if tool else "none", PAYLOAD, 0.0, senders=senders)
    if tool is None:
        r.sent, r.sender_pps, _ports = _send_all(sender, cpus, count)
        return r
    path = os.path.join(where, f"fcap-bench-flood-{os.getpid()}{tool.suffix}")
    with running(tool, path, ["taskset", "-c", str(reader)] if reader is not None else []) as child:
        cpu0 = _proc_cpu_s(child.p.pid)
        r.sent, r.sender_pps, ports = _send_all(sender, cpus, count)
        time.sleep(SETTLE_S)
        cpu, lines = child.stop()
        r.cpu_run_s = max(cpu - cpu0, 0.0)
        _summary(lines, r)
        if child.p.returncode not in (0, -signal.SIGINT, 130):
            r.notes.append(f"exit status {child.p.returncode}: {' | '.join(lines[-3:])}")
        r.in_file = count_in_file(path, ports)
    return r


def idle_cpu(tool: Tool, where: str, seconds: float = 2.0) -> float:
    """The tool's CPU from `listening on` to its exit with no traffic for `seconds` (what a run's CPU is less)."""
    with running(tool, os.path.join(where, f"fcap-bench-idle-{os.getpid()}{tool.suffix}"), []) as child:
        cpu0 = _proc_cpu_s(child.p.pid)
        time.sleep(seconds)
        cpu, _lines = child.stop()
        return max(cpu - cpu0, 0.0)


def measure(ns: list[int], count: int, rounds: int, names: list[str], extra: list[str], where: str,
            log, baseline: list[str] | None = None) -> list[FloodResult]:
    from .capture import FCAP, OUT_DIR
    OUT_DIR[0] = where
    configs = tools(extra)
    if baseline:   # another fcap beside this one, in the same rounds
        mine, FCAP[:] = list(FCAP), baseline
        for name, tool in tools(extra).items():
            if name.startswith("fcap"):
                configs[name + " (baseline)"] = dataclasses.replace(tool, name=name + " (baseline)")
        FCAP[:] = mine
    chosen = [configs[n] for n in names]
    idle = {t.name: sorted(idle_cpu(t, where) for _ in range(2))[0] for t in chosen}
    log("idle CPU from `listening on` to exit: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in idle.items()))
    sender = Sender()
    out = []
    try:
        for n in ns:
            for rnd in range(rounds):
                for tool in [None] + chosen:
                    r = run_one(sender, tool, n, count, where)
                    if tool is not None:
                        r.cpu_run_s = max(r.cpu_run_s - idle[tool.name], 0.0)
                    r.notes.append(f"round {rnd + 1}")
                    out.append(r)
                    cpu = r.cpu_ns_per_pkt
                    log(f"senders {n:2d} {r.tool:<12} {r.sender_pps / 1e6:6.3f} Mpps  in file {r.share * 100:7.3f}%  "
                        + (f"cpu {cpu:7.0f} ns/pkt  " if cpu else "") + f"dropped {r.dropped}")
    finally:
        sender.close()
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def table(results: list[FloodResult], names: list[str]) -> list[str]:
    head = "| senders | bare | " + " | ".join(f"{n}: share / senders / CPU per packet" for n in names) + " |"
    out = [head, "|---|---|" + "---|" * len(names)]
    for n in sorted({r.senders for r in results}):
        mine = [r for r in results if r.senders == n]
        bare = _median([r.sender_pps for r in mine if r.tool == "none"])
        cells = [f"{bare / 1e6:.2f} Mpps"]
        for name in names:
            rs = [r for r in mine if r.tool == name]
            if not rs:
                cells.append("")
                continue
            share = _median([r.share for r in rs])
            speed = _median([r.sender_pps for r in rs]) / bare if bare else 0
            cpu = [r.cpu_ns_per_pkt for r in rs if r.cpu_ns_per_pkt]
            cells.append(f"{share:.4f} / {speed:.2f} / " + (f"{_median(cpu):.0f} ns" if cpu else "-"))
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


NFT_TABLE = "fcap_bench_drop"


@contextlib.contextmanager
def nft_drop():
    """While it lasts: the flood's datagrams dropped by nftables at input (a table of the bench's, `udp length`),
    and fcap's capture point the drop point."""
    from . import capture
    rules = [f"add table inet {NFT_TABLE}",
             f"add chain inet {NFT_TABLE} in {{ type filter hook input priority 0; }}",
             f"add rule inet {NFT_TABLE} in udp length {PAYLOAD + 8} drop"]
    for r in rules:
        p = subprocess.run(["nft", *shlex.split(r)], capture_output=True, text=True)
        if p.returncode:
            subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], capture_output=True)
            raise BenchError(f"nft {r}: {p.stderr.strip()}")
    point, capture.POINT = capture.POINT, "tp_btf/kfree_skb"
    try:
        yield
    finally:
        capture.POINT = point
        subprocess.run(["nft", "delete", "table", "inet", NFT_TABLE], capture_output=True)


def default_senders(ncpu: int) -> list[int]:
    """1, 2, 4, ... below the CPU count, and one sender per CPU but the reader's (2 CPUs: 1 and 2, the reader
    sharing)."""
    ns = {1 << k for k in range(ncpu.bit_length()) if 1 << k < ncpu}
    return sorted(ns | {ncpu - 1 if ncpu > 2 else ncpu})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__)
    ap.add_argument("--senders", default="", help="the N to run, e.g. 1,2,4 (default: 1 up to one per CPU)")
    ap.add_argument("--count", type=int, default=300_000, help="datagrams each sender sends")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tools", default="tcpdump,dumpcap,fcap pcap,fcap pcapng",
                    help="comma-separated: tcpdump, dumpcap, fcap pcap, fcap pcapng; printed lines: tcpdump -nn, "
                         "fcap -nn, tcpdump -nn -v, fcap -nn -v (-l, into a file); JSON lines: fcap --json")
    ap.add_argument("--fcap-args", default="", help="more fcap flags, e.g. '-B 262144'")
    ap.add_argument("--fcap", metavar="CMD", help="run fcap as CMD (e.g. 'env PYTHONPATH=/tmp/old python3 -m "
                    "fcap.commands.cli', to measure another version)")
    ap.add_argument("--baseline", metavar="CMD", help="also run fcap as CMD in the same rounds (its rows marked "
                    "'(baseline)'), e.g. an older checkout: 'env PYTHONPATH=/tmp/old python3 -m fcap.commands.cli'")
    ap.add_argument("--nft-drop", action="store_true",
                    help="a flood nftables drops: a table of the bench's drops the senders' datagrams at input "
                         "(udp length), fcap captures at the drop point (tp_btf/kfree_skb): for --nft beside a plain "
                         "capture there, e.g. --tools 'fcap pcapng' --fcap '... --nft' --baseline '...'")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.flood: needs root", file=sys.stderr)
        return 2
    ncpu = len(os.sched_getaffinity(0))
    ns = [int(x) for x in args.senders.split(",")] if args.senders else default_senders(ncpu)
    names = [n.strip() for n in args.tools.split(",") if n.strip()]
    if args.baseline:
        names += [n + " (baseline)" for n in names if n.startswith("fcap")]
    if args.fcap:
        from . import capture
        capture.FCAP[:] = shlex.split(args.fcap)
    try:
        with nft_drop() if args.nft_drop else contextlib.nullcontext():
            results = measure(ns, args.count, args.rounds, names, args.fcap_args.split(), args.dir,
                              lambda m: print(m, file=sys.stderr, flush=True),
                              shlex.split(args.baseline) if args.baseline else None)
    except BenchError as e:
        print(f"bench.flood: {e}", file=sys.stderr)
        return 1
    from .report import machine
    print("\n".join(machine()))
    print(f"- {args.count:,} datagrams of {PAYLOAD} bytes per sender, snaplen {SNAPLEN}, files in {args.dir}; "
          f"median of {args.rounds} round(s); share / senders' rate vs bare / the tool's CPU per packet in its file")
    print()
    print("\n".join(table(results, names)))
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
