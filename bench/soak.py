"""python3 -m bench.soak --minutes N --rate PPS: one fcap capture of a steady UDP stream on lo for N minutes,
written through -C/-W rotation; reports whether captured + dropped = sent, and the capture process's resident
memory and open descriptors (from /proc/PID) after a warm-up and at the end, with samples between."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from . import report as bench_report
from . import traffic
from .capture import POINT, Result, _Child, _summary, fcap_argv
from .traffic import SENDER_CPU, BenchError, Sender, pinned

RSS_GROWTH_MAX_KB = 5 * 1024
BEGIN, END = "<!-- bench:soak:begin -->", "<!-- bench:soak:end -->"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Soak:
    minutes: float
    rate: int
    payload: int
    fmt: str
    argv: list[str] = field(default_factory=list)
    sent: int = 0
    sender_s: float = 0.0
    captured: int | None = None
    received: int | None = None
    dropped: int | None = None
    files: dict[str, int] = field(default_factory=dict)     # what the rotation left: name -> bytes
    samples: list[tuple[float, int, int]] = field(default_factory=list)   # (seconds in, RSS kB, fds)
    load: tuple[str, str] = ("", "")                         # /proc/loadavg at start and end
    status: int | None = None

    @property
    def balanced(self) -> bool:
        return self.captured is not None and self.dropped is not None and self.captured + self.dropped == self.sent

    @property
    def rss_growth_kb(self) -> int:
        return self.samples[-1][1] - self.samples[0][1] if len(self.samples) > 1 else 0

    @property
    def ok(self) -> bool:
        return self.balanced and self.rss_growth_kb < RSS_GROWTH_MAX_KB and self.status == 0 and \
            self.samples[0][2] == self.samples[-1][2]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m bench.soak", description=__doc__)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the traffic runs (default 10)")
    ap.add_argument("--rate", type=int, default=100_000, help="datagrams per second (default 100000)")
    ap.add_argument("--payload", type=int, default=64, help="UDP payload bytes (default 64)")
    ap.add_argument("--format", choices=("pcap", "pcapng"), default="pcap")
    ap.add_argument("--snaplen", type=int, default=128)
    ap.add_argument("--size", type=int, default=100, help="-C: millions of bytes per file (default 100)")
    ap.add_argument("--files", type=int, default=2, help="-W: files in the ring (default 2)")
    ap.add_argument("--dir", default="/dev/shm", help="where the files go (default /dev/shm: no disk traffic)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of traffic before the first sample")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--write", action="store_true", help="rewrite BENCHMARKS.md's Soak section with the figures")
    return ap


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sample(pid: int) -> tuple[int, int]:
    """(VmRSS in kB, open descriptors) of a running process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run(args, log) -> Soak:
    traffic.RT_PRIORITY = 0    # a shared machine: pinned, but no real-time priority for minutes on end
    s = Soak(args.minutes, args.rate, args.payload, args.format)
    sender = Sender()
    out = tempfile.mkdtemp(prefix="fcap-soak-", dir=args.dir)
    child = None
    try:
        port = _free_port()
        s.argv = fcap_argv() + ["-i", POINT, "-s", str(args.snaplen), "-C", str(args.size), "-W", str(args.files),
                                "-w", os.path.join(out, f"soak.{args.format}"), f"udp dst port {port}"]
        child = _Child(s.argv)
        child.ready()
        s.load = (_loadavg(), "")
        count = int(args.rate * args.minutes * 60)
        snd = subprocess.Popen(pinned(SENDER_CPU, [sender.path, str(args.payload), str(count), str(args.rate),
                                                   "32", "1", str(port)]),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        _watch(s, snd, child.p.pid, t0, args, log)
        outs, errs = snd.communicate()
        if snd.returncode != 0:
            raise BenchError(f"sender failed: {errs.strip()}")
        f = outs.split()
        s.sent, s.sender_s = int(f[1]), int(f[3]) / 1e9
        time.sleep(1.5)     # what is still in the rings reaches the file
        s.samples.append((time.monotonic() - t0, *_sample(child.p.pid)))
        s.load = (s.load[0], _loadavg())
        _, lines = child.stop()
        s.status = child.p.returncode
        r = Result("fcap", args.payload, args.rate)
        _summary(lines, r)
        s.captured, s.received, s.dropped = r.captured, r.received, r.dropped
        s.files = {n: os.path.getsize(os.path.join(out, n)) for n in sorted(os.listdir(out))}
    finally:
        if child is not None:
            child.kill()
        sender.close()
        shutil.rmtree(out, ignore_errors=True)
    return s


def _watch(s: Soak, snd: subprocess.Popen, pid: int, t0: float, args, log) -> None:
    """Samples after the warm-up and then every `args.every` seconds while the sender runs."""
    due = t0 + args.warmup
    while snd.poll() is None:
        now = time.monotonic()
        if now >= due:
            rss, fds = _sample(pid)
            s.samples.append((now - t0, rss, fds))
            log(f"soak: {now - t0:6.0f} s  RSS {rss} kB  fds {fds}  load {_loadavg()}")
            due += args.every
        time.sleep(min(1.0, max(due - now, 0.05)))


def report(s: Soak) -> str:
    first, last = s.samples[0], s.samples[-1]
    lines = [
        f"- command: `{' '.join(os.path.basename(a) if i == 0 else a for i, a in enumerate(s.argv))}`",
        f"- traffic: {s.rate:,} datagrams/s of {s.payload} bytes for {s.minutes:g} min asked (bench/sender.c, "
        f"{s.sent:,} sent in {s.sender_s:.0f} s: {s.sent / max(s.sender_s, 1e-9):,.0f}/s on average; a sender that "
        "falls behind its schedule sends as fast as it can until it is back on it)",
        f"- captured {s.captured:,} + dropped {s.dropped:,} = {(s.captured or 0) + (s.dropped or 0):,}; sent "
        f"{s.sent:,}: {'equal' if s.balanced else 'NOT equal'} (received by filter {s.received:,})",
        f"- RSS {first[1]:,} kB after {first[0]:.0f} s, {last[1]:,} kB at the end ({last[0]:.0f} s): "
        f"{s.rss_growth_kb:+,} kB",
        f"- open fds {first[2]} after {first[0]:.0f} s, {last[2]} at the end",
        "- files left by -W: " + ", ".join(f"{n} ({b:,} bytes)" for n, b in s.files.items()),
        f"- load average (1, 5, 15 min) at the start {s.load[0]}, at the end {s.load[1]}; exit status {s.status}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("bench.soak: needs root (fcap captures)", file=sys.stderr)
        return 2

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
    try:
        s = run(args, log)
    except BenchError as e:
        print(f"bench.soak: {e}", file=sys.stderr)
        return 1
    if not s.samples:
        print("bench.soak: no sample taken (the run was shorter than the warm-up)", file=sys.stderr)
        return 1
    sys.stdout.write(report(s))
    if args.write:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        bench_report.write_section(os.path.join(ROOT, "BENCHMARKS.md"),
                                   f"{BEGIN}\n\nMade by `python3 -m bench.soak --minutes {args.minutes:g} --rate "
                                   f"{args.rate}` on {when}; {'passed' if s.ok else 'FAILED'} (captured + dropped = "
                                   f"sent, RSS growth under {RSS_GROWTH_MAX_KB // 1024} MB, as many fds at the end)."
                                   f"\n\n{report(s)}\n{END}", BEGIN, END)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(asdict(s) | {"rss_growth_kb": s.rss_growth_kb, "balanced": s.balanced}, f, indent=1)
    return 0 if s.ok else 1


if __name__ == "__main__":
    sys.exit(main())
