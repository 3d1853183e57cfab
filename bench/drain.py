"""python -m bench.drain: the drain alone, on any machine. K CPUs' file rings (bench.replay: the capture program's
layout, filled as it fills them) hold records whose times interleave every GRAIN records, and the real drain
(fcap.live.ringdrain.RingDrain, into a real pcap file) merges them in one pass, timed; per K, records and MB per second
and ns per record, through numpy's merge (fcap.live.fastmerge) and through the runs merge (fcap.live.order) it
replaced. What the user side costs, apart from the kernel and the traffic."""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import time

from fcap.files.pcapfile import PcapWriter
from fcap.live import order
from fcap.live.drain import FAST
from fcap.live.ringdrain import RingDrain

from .replay import Doorbells, ReplayRings, pcap_record

FRAME = 14 + 20 + 8 + 64     # a 64-byte UDP datagram at an Ethernet point
START_NS = 10**15


def fill(rings: ReplayRings, per_cpu: int, grain: int, gap_ns: int = 100) -> int:
    """per_cpu records on each CPU, the CPUs taking turns every `grain` records (1: each record's neighbours in
    time are on other CPUs); returns the records written."""
    k = rings.max_entries
    n = 0
    for j in range(per_cpu):
        for cpu in range(k):
            seq = (j // grain) * grain * k + cpu * grain + j % grain
            ts = START_NS + seq * gap_ns
            frame = struct.pack(">QI", seq, cpu) + bytes(FRAME - 12)
            if not rings.publish(cpu, ts, pcap_record(ts, frame)):
                raise RuntimeError(f"ring {cpu} full after {j} records: a larger --ring")
            n += 1
    return n


def one(k: int, per_cpu: int, grain: int, fast: bool, ring: int, path: str) -> tuple[float, float, int, int]:
    """One pass over freshly filled rings: (wall s, CPU s, records, bytes)."""
    rings = ReplayRings(k, ring)
    try:
        fill(rings, per_cpu, grain)
        with open(path, "wb") as f:
            w = PcapWriter(f, linktype=1, snaplen=262144)
            d = RingDrain(rings, ring, Doorbells(), w, window=order.Window(), fast=fast)
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            n = d(final=True)
            w.flush()
            t1, c1 = time.perf_counter_ns(), time.process_time_ns()
            d.close()
        return (t1 - t0) / 1e9, (c1 - c0) / 1e9, n, os.path.getsize(path) - 24
    finally:
        rings.close()
        os.unlink(path)


def ring_for(records: int) -> int:
    """Each CPU's ring: the power of two that holds its records with a quarter to spare."""
    need = records * (16 + FRAME) * 5 // 4
    return max(1 << 16, 1 << (need - 1).bit_length())


def measure(ks: list[int], total: int, grain: int, rounds: int, where: str, log) -> list[dict]:
    if FAST.wait() is None:
        raise SystemExit(f"bench.drain: numpy's merge cannot be imported: {FAST.missing}")
    rows = []
    path = os.path.join(where, f"fcap-bench-drain-{os.getpid()}.pcap")
    for k in ks:
        for fast in (True, False):
            # (the runs merge over fewer records where it takes microseconds each: its rate is what is compared)
            per_cpu = max(1, total // k // (1 if fast or k <= 4 else 4))
            runs = [one(k, per_cpu, grain, fast, ring_for(per_cpu), path) for _ in range(rounds)]
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            n, size = runs[0][2], runs[0][3]
            row = dict(cpus=k, merge="numpy" if fast else "runs", records=n, bytes=size, wall_s=wall, cpu_s=cpu,
                       rps=n / wall, mbps=size / wall / 1e6, ns=wall * 1e9 / n)
            rows.append(row)
            log(f"K={k:3d} {row['merge']:5s} {n:8d} records  {row['rps'] / 1e6:7.2f} M records/s  "
                f"{row['mbps']:8.1f} MB/s  {row['ns']:8.1f} ns/record")
    return rows


def table(rows: list[dict], grain: int) -> list[str]:
    out = ["| CPUs (K) | merge | records a pass | records/s | MB/s | ns per record | vs runs |",
           "|---|---|---|---|---|---|---|"]
    by = {(r["cpus"], r["merge"]): r for r in rows}
    for r in rows:
        base = by.get((r["cpus"], "runs"))
        ratio = f"{base['ns'] / r['ns']:.0f}x faster" if base and r["merge"] == "numpy" and r["cpus"] > 1 else ""
        if r["cpus"] == 1 and r["merge"] == "numpy":
            ratio = "(one CPU: one run, no sort, both ways)"
        out.append(f"| {r['cpus']} | {r['merge']} | {r['records']:,} | {r['rps'] / 1e6:.2f} M | {r['mbps']:.0f} | "
                   f"{r['ns']:.0f} | {ratio} |")
    out.append("")
    out.append(f"(records of {16 + FRAME} bytes, each CPU's interleaved with the others' every {grain} "
               "record(s); one pass into a pcap file, median of the rounds)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.drain", description=__doc__)
    ap.add_argument("--cpus", default="1,2,4,16,64", help="the K to replay (default 1,2,4,16,64)")
    ap.add_argument("--records", type=int, default=200_000, help="records a pass, all CPUs together")
    ap.add_argument("--grain", type=int, default=1, help="records of one CPU in a row before the next CPU's")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm", help="where the pcap file goes")
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.cpus.split(",")]
    rows = measure(ks, args.records, args.grain, args.rounds, args.dir,
                   lambda m: print(m, file=sys.stderr, flush=True))
    print("\n".join(table(rows, args.grain)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
