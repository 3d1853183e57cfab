"""The drain's ceiling: how fast one fcap process empties full file rings into a file. fcap (-B 131072: 64 MiB per
CPU) is stopped (SIGSTOP) while the sender fills its CPU's ring, then let go (SIGCONT): the records it writes, the
wall time until the file stops growing and the CPU it spends give packets/s and MB/s at one busy core."""

from __future__ import annotations

import os
import signal
import statistics
import time
from dataclasses import dataclass

from . import capture
from .capture import POINT, _Child, _proc_cpu_s, count_in_file, fcap_argv
from .traffic import BenchError, Sender

RING_KIB = 131072         # -B: 64 MiB per CPU on this 2-CPU machine
CASES = (                 # (format, payload bytes, snap length, datagrams): each fits one CPU's 64 MiB ring
    ("pcap", 64, 128, 400_000),
    ("pcapng", 64, 128, 180_000),
    ("pcap", 1400, 1500, 40_000),
    ("pcapng", 1400, 1500, 36_000),
)


@dataclass
class Ceiling:
    fmt: str
    payload: int
    records: int          # the sender's datagrams in the file
    bytes: int            # the file's size
    wall_s: float         # SIGCONT to the file's last byte
    cpu_s: float          # the process's CPU over the same span

    @property
    def pps_wall(self) -> float:
        return self.records / self.wall_s

    @property
    def pps_cpu(self) -> float:
        return self.records / self.cpu_s

    @property
    def mbps_cpu(self) -> float:
        return self.bytes / self.cpu_s / 1e6


def _settled(path: str, quiet_s: float = 0.2, limit_s: float = 60) -> float:
    """Poll the file's size until it has not grown for quiet_s; the time of its last growth (monotonic)."""
    last, at, deadline = -1, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        size = os.stat(path).st_size if os.path.exists(path) else 0
        now = time.monotonic()
        if size != last:
            last, at = size, now
        elif now - at >= quiet_s:
            return at
        time.sleep(0.0005)
    raise BenchError(f"{path} still growing after {limit_s:.0f} s")


def one(sender: Sender, fmt: str, payload: int, snaplen: int, count: int) -> Ceiling:
    path = os.path.join(capture.OUT_DIR[0], f"fcap-bench-ceiling-{os.getpid()}.{fmt}")
    child = _Child(fcap_argv() + ["-i", POINT, "-s", str(snaplen), "-B", str(RING_KIB), "-w", path])
    try:
        child.ready()
        time.sleep(0.3)                      # (the file header written, the loop waiting)
        size0 = os.stat(path).st_size
        os.kill(child.p.pid, signal.SIGSTOP)
        try:
            sent = sender.send(payload, count)
        finally:
            cpu0 = _proc_cpu_s(child.p.pid)
            t0 = time.monotonic()
            os.kill(child.p.pid, signal.SIGCONT)
        t1 = _settled(path)
        cpu1 = _proc_cpu_s(child.p.pid)
        size = os.stat(path).st_size - size0
        _cpu, lines = child.stop()
        if not any(line.startswith("0 packets dropped") for line in lines):
            raise BenchError(f"the ring overflowed ({fmt}, {payload} B): {' | '.join(lines[-3:])}")
        n = count_in_file(path, sent.port)
    finally:
        child.kill()
        if os.path.exists(path):
            os.unlink(path)
    return Ceiling(fmt, payload, n, size, t1 - t0, max(cpu1 - cpu0, 1e-9))


def run(sender: Sender, reps: int, log) -> list[Ceiling]:
    """Each case `reps` times; the medians."""
    out = []
    for fmt, payload, snaplen, count in CASES:
        runs = []
        for _ in range(reps):
            c = one(sender, fmt, payload, snaplen, count)
            runs.append(c)
            log(f"  ceiling {fmt:<6} {payload:>5} B: {c.records} records, {c.bytes / 1e6:.1f} MB in {c.wall_s:.3f} s "
                f"wall, {c.cpu_s:.3f} s CPU: {c.pps_cpu / 1e6:.2f} Mpps, {c.mbps_cpu:.0f} MB/s per core")
        m = Ceiling(fmt, payload, runs[0].records, runs[0].bytes, statistics.median(r.wall_s for r in runs),
                    statistics.median(r.cpu_s for r in runs))
        out.append(m)
    return out


def table(results: list[Ceiling]) -> list[str]:
    lines = ["### The drain's ceiling", "",
             f"fcap (`-B {RING_KIB}`: 64 MiB per CPU) stopped while the sender fills one CPU's ring, then let go: "
             "the records it writes, the time until the file stops growing, its CPU over that span (bench/ceiling.py)."
             " Packets/s and MB/s at one core's worth of CPU.", "",
             "| file | payload (snap) | records | MB written | wall s | CPU s | packets/s per core | MB/s per core |",
             "|---|---|---|---|---|---|---|---|"]
    for c in results:
        snap = next(s for f, p, s, _n in CASES if f == c.fmt and p == c.payload)
        lines.append(f"| {c.fmt} | {c.payload} B ({snap}) | {c.records:,} | {c.bytes / 1e6:.1f} | {c.wall_s:.3f} | "
                     f"{c.cpu_s:.3f} | {c.pps_cpu / 1e6:.2f} M | {c.mbps_cpu:.0f} |")
    lines.append("")
    return lines
