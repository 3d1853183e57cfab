"""BPF run time per hit of fcap's capture program: kernel run-time stats on, N 64-byte UDP datagrams on lo.

    python -m bench.bpf_runtime [-n 200000] [--reps 3] [--point tp_btf/net_dev_queue]

For each case the fcap command runs as users run it (`fcap -i POINT -w FILE.pcap ...`); its programs are found
through /proc/PID/fdinfo, and run_time_ns / run_cnt is read before and after the traffic, with
kernel.bpf_stats_enabled on (BPF_ENABLE_STATS) for the duration. The sender is a Python process pinned to CPU 0,
sending to a socket it never reads (no ICMP replies). The per-hit number is the median over --reps runs; every
hit on the point counts, so other traffic on the machine at the same time is averaged in (the hits column says
how many there were: about N when the machine is quiet). The first row is an empty program at the same point:
the stats time each run with sched_clock(), and that cost (large in some VMs) is in every number; "net of the
floor" subtracts it. Prints a markdown table. Needs root."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bpf.sys import FD, GetIdAttr, ProgInfo, bpf, enable_stats, obj_info  # noqa: E402
from bpf.uapi import Cmd  # noqa: E402

POINT = "tp_btf/net_dev_queue"
PAYLOAD = 64

SENDER = r"""
import socket, sys
port, n, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)     # full at once: later datagrams dropped quietly
sink.bind(("127.0.0.1", port))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("127.0.0.1", port))
data = b"\x5a" * size
send = s.send
for _ in range(n):
    send(data)
"""


def cases(port: int) -> list[tuple[str, list[str] | None, str]]:
    """(name, fcap arguments after -i POINT -w FILE (None: an empty program, no fcap), target)."""
    return [
        ("empty program (the floor: stats timing, trampoline)", None, ""),
        ("no filter: capture 64 B", [], "<= 150 ns"),
        ("filter rejects ('udp port 1')", ["udp port 1"], "<= 30 ns"),
        (f"filter matches ('udp dst port {port}')", [f"udp dst port {port}"], ""),
        ("filter rejects, over a copy (the conservative variant)", [GIVE_UP + "head_loads", "udp port 1"], ""),
        ("filter matches, over a copy (the conservative variant)", [GIVE_UP + "head_loads", f"udp dst port {port}"],
         ""),
        ("predicate rejects (--where 'skb->len > 1000')", ["--where", "skb->len > 1000"], "<= 30 ns"),
        ("predicate matches (--where 'skb->len < 1000')", ["--where", "skb->len < 1000"], ""),
        ("--pid rejects", ["--pid", "1"], "<= 30 ns"),
    ]


GIVE_UP = "--give-up="   # (a case's first argument: fcap runs with that conservative variant in force)
# fcap's command with conservative variants (fcap.kernel.variants) given up from the start: argv[1] names them
GIVEN_UP = """
import sys
from fcap.live.planner import Planner
names = sys.argv.pop(1).split(",")
init = Planner.__init__
def given_up(self, cfg):
    init(self, cfg)
    self.given_up.update(names)
Planner.__init__ = given_up
from fcap.commands.cli import main
sys.exit(main(sys.argv[1:]))
"""


def fcap_argv(args: list[str] = ()) -> tuple[list[str], list[str]]:
    """The command that runs fcap for a case's arguments, and the arguments left for it."""
    if args and args[0].startswith(GIVE_UP):
        return [sys.executable, "-c", GIVEN_UP, args[0][len(GIVE_UP):]], list(args[1:])
    exe = shutil.which("fcap")
    return ([exe] if exe else [sys.executable, "-m", "fcap.commands.cli"]), list(args)


def program_fds(pid: int) -> list[FD]:
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                ids.update(int(line.split()[1]) for line in f if line.startswith("prog_id:"))
        except OSError:
            continue
    return [FD(bpf(Cmd.PROG_GET_FD_BY_ID, GetIdAttr(start_id=i), f"open program {i}")) for i in sorted(ids)]


def totals(fds: list[FD]) -> tuple[int, int]:
    ns = cnt = 0
    for fd in fds:
        info = obj_info(fd.fd, ProgInfo(), "read program stats")
        ns, cnt = ns + info.run_time_ns, cnt + info.run_cnt
    return ns, cnt


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send(port: int, n: int) -> float:
    t0 = time.monotonic()
    subprocess.run(["taskset", "-c", "0", sys.executable, "-c", SENDER, str(port), str(n), str(PAYLOAD)],
                   check=True, timeout=600)
    return time.monotonic() - t0


def measure_floor(n: int, port: int, point: str) -> tuple[float, int, float]:
    """The floor: an empty program (r0 = 0; exit) at the same point, as the stats see it (they time each run
    with sched_clock, whose cost is in every number)."""
    from bpf import asm
    from bpf.link import attach_tracing
    from bpf.prog import load
    from bpf.uapi import AttachType, ProgType
    from fcap.points.spec import resolve
    pt = resolve(point)
    if not pt.typed:
        raise SystemExit(f"{point}: the floor is measured at BTF-typed points only")
    prog = load(ProgType.TRACING, [asm.movi(asm.R0, 0), asm.exit_()], name="fcap_floor",
                expected_attach_type=AttachType.TRACE_RAW_TP if str(pt.kind) == "tp_btf" else AttachType.TRACE_FENTRY,
                attach_btf_id=pt.btf_id, what="an empty program")
    try:
        with attach_tracing(prog.fileno(), point), enable_stats():
            before = totals([prog.fd])
            secs = send(port, n)
            after = totals([prog.fd])
    finally:
        prog.close()
    ns, cnt = after[0] - before[0], after[1] - before[1]
    return (ns / cnt if cnt else float("nan")), cnt, secs


def measure(args: list[str] | None, n: int, port: int, point: str, workdir: str) -> tuple[float, int, float]:
    """One run: (ns per hit, hits, sender seconds). args None: the floor."""
    if args is None:
        return measure_floor(n, port, point)
    out = os.path.join(workdir, "out.pcap")
    cmd, args = fcap_argv(args)
    p = subprocess.Popen(["taskset", "-c", "1", *cmd, "-i", point, "-w", out, *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    fds: list[FD] = []
    try:
        line = p.stderr.readline()
        if not line.startswith("listening on"):
            p.wait(timeout=30)
            raise SystemExit(f"fcap {' '.join(args)}: {line}{p.stderr.read()}")
        fds = program_fds(p.pid)
        if not fds:
            raise SystemExit(f"fcap {' '.join(args)}: no BPF program found in /proc/{p.pid}/fdinfo")
        with enable_stats():
            before = totals(fds)
            secs = send(port, n)
            after = totals(fds)
    finally:
        for fd in fds:
            fd.close()
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stderr.close()
        if os.path.exists(out):
            os.unlink(out)
    ns, cnt = after[0] - before[0], after[1] - before[1]
    return (ns / cnt if cnt else float("nan")), cnt, secs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bpf_runtime", description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000, help="datagrams per run (default 200000)")
    ap.add_argument("--reps", type=int, default=3, help="runs per case; the median is reported (default 3)")
    ap.add_argument("--point", default=POINT, help=f"capture point (default {POINT})")
    ap.add_argument("--only", metavar="WORD", help="only the cases whose name has WORD (and the floor)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.bpf_runtime: needs root (loads BPF programs, turns on BPF run-time stats)", file=sys.stderr)
        return 2
    for tool in ("taskset",):
        if shutil.which(tool) is None:
            print(f"bench.bpf_runtime: {tool} is not installed", file=sys.stderr)
            return 2
    port = free_port()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fcap-bpf-runtime-") as d:
        for name, args, target in cases(port):
            if a.only and args is not None and a.only not in name:
                continue
            runs = [measure(args, a.n, port, a.point, d) for _ in range(a.reps)]
            per_hit = statistics.median(r[0] for r in runs)
            hits = int(statistics.median(r[1] for r in runs))
            kpps = statistics.median(a.n / r[2] for r in runs) / 1000
            spread = f"{min(r[0] for r in runs):.0f}–{max(r[0] for r in runs):.0f}"
            rows.append((name, per_hit, spread, hits, kpps, target))
            print(f"  {name}: {per_hit:.1f} ns/hit ({spread}), {hits} hits, sender {kpps:.0f} kpps",
                  file=sys.stderr, flush=True)
    uname = os.uname()
    print(f"\nBPF run time per hit at `{a.point}`, {a.n} × {PAYLOAD}-byte UDP datagrams on lo per run, median of "
          f"{a.reps} runs (kernel {uname.release}, {os.cpu_count()} CPUs):\n")
    floor = rows[0][1] if cases(port)[0][1] is None else 0.0
    print("| case | ns per hit | net of the floor | range | hits | sender kpps | target (net) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for i, (name, per_hit, spread, hits, kpps, target) in enumerate(rows):
        net = "" if i == 0 and floor else f"{per_hit - floor:.1f}"
        print(f"| {name} | {per_hit:.1f} | {net} | {spread} | {hits} | {kpps:.0f} | {target} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
