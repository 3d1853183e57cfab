"""Following packets: how fast a glob of points attaches, and what many points cost per hit.

    python -m bench.follow attach [GLOB ...] [--sizes 10,100,all] [--reps 3]
    python -m bench.follow cost [--points 1,50] [--first POINT] [--glob GLOB] [-n 20000]
    python -m bench.follow track [--points P,P,P] [-n 20000] [--filter F]
    python -m bench.follow retarget

`attach`: for each glob and each size N (the first N matches, in list-devices order), a capture session as the
fcap command makes it: resolve (BTF), load (build + verify each program), attach; points per second over load
and attach. `cost`: N 64-byte UDP datagrams on lo with 1 point and with more attached, kernel run-time stats on:
the BPF run time per hit and hits per datagram. `track`: the same points and filter with and without --track.
Prints markdown tables. Needs root. Default globs: tracepoints
on a kernel that refuses fentry (tp_btf/*), else fentry/ip_* and fentry/tcp_*."""

from __future__ import annotations

import argparse
import collections
import os
import socket
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bpf import probes  # noqa: E402
from bpf.btf import BTF  # noqa: E402
from bpf.sys import enable_stats  # noqa: E402
from bpf.uapi import AttachType  # noqa: E402
from fcap.live.session import Config, Session  # noqa: E402


def fentry_allowed() -> bool:
    func = BTF.vmlinux().find("ip_output", "func")
    return func is not None and probes.tracing_program(AttachType.TRACE_FENTRY, func.id) is None


def default_globs() -> list[str]:
    return ["fentry/ip_*", "fentry/tcp_*"] if fentry_allowed() else ["tp_btf/*"]


def session_for(glob: str | list[str], n: int | None, **cfg) -> Session:
    s = Session(Config(points=[glob] if isinstance(glob, str) else glob, **cfg))
    s.resolve()
    if n is not None:
        s.points = s.points[:n]
    return s


def attach_once(glob: str, n: int | None) -> dict:
    t0 = time.perf_counter()
    s = session_for(glob, n)
    t1 = time.perf_counter()
    try:
        s.open()
        t2 = time.perf_counter()
        s.attach()
        t3 = time.perf_counter()
        got = len(s.links)
    finally:
        s.close()
    t4 = time.perf_counter()
    for spec, why in s.skipped:
        WHY[why[len(spec) + 2:] if why.startswith(spec + ": ") else why] += 1
    return dict(matches=got + len(s.skipped), attached=got, skipped=len(s.skipped), resolve=t1 - t0,
                load=t2 - t1, attach=t3 - t2, close=t4 - t3)


WHY: collections.Counter = collections.Counter()   # why matches were skipped, over every run


def attach_table(globs: list[str], sizes: list[int | None], reps: int) -> list[str]:
    kernel = os.uname().release
    lines = [f"Attach rate on {kernel} (median of {reps}; load = build + verify every program):", "",
             "| glob | points | attached | skipped | resolve s | load s | attach s | detach s | points/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for glob in globs:
        total = len(session_for(glob, None).points)
        for n in sizes:
            if n is not None and n >= total and None in sizes:
                continue
            runs = [attach_once(glob, n) for _ in range(reps)]
            m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rate = m["attached"] / (m["load"] + m["attach"]) if m["load"] + m["attach"] else 0
            lines.append(f"| `{glob}` | {int(m['matches'])}{' (all)' if n is None else ''} | {int(m['attached'])} "
                         f"| {int(m['skipped'])} | {m['resolve']:.2f} | {m['load']:.2f} | {m['attach']:.2f} "
                         f"| {m['close']:.2f} | {rate:.0f} |")
    if WHY:
        lines += ["", "Why matches were skipped (every run):", ""]
        lines += [f"- {n} × {why}" for why, n in WHY.most_common()]
    return lines


def udp_flood(n: int, size: int = 64) -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sink.bind(("127.0.0.1", 0))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(sink.getsockname())
    data = b"\x5a" * size
    for _ in range(n):
        s.send(data)
    s.close()
    sink.close()


def cost_once(points: list[str], npoints: int | None, n: int, **cfg) -> dict:
    s = session_for(points, npoints, **cfg)
    try:
        s.open()
        s.attach()
        ncapture = len(s.programs)
        progs = s.programs + [prog for _p, prog in s.helpers]   # (the identity map's helpers: fcap.kernel.track)
        with enable_stats():
            before = [p.stats() for p in progs]
            t0 = time.perf_counter()
            udp_flood(n)
            wall = time.perf_counter() - t0
            after = [p.stats() for p in progs]
        s.buffer.drain(lambda cpu, raw: None)
    finally:
        s.close()
    ns = sum(a.run_time_ns - b.run_time_ns for a, b in zip(after, before))   # (helpers' time included)
    hits = sum(a.run_cnt - b.run_cnt for a, b in zip(after[:ncapture], before))
    return dict(points=len(s.points), hits=hits, ns_per_hit=ns / hits if hits else 0, hits_per_pkt=hits / n,
                ns_per_pkt=ns / n, us_per_send=wall / n * 1e6)


def _median(runs: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def _row(label: str, m: dict) -> str:
    return (f"| {label} | {int(m['points'])} | {m['hits_per_pkt']:.1f} | {m['ns_per_hit']:.0f} | {m['ns_per_pkt']:.0f} "
            f"| {m['us_per_send']:.1f} |")


HEAD = ["| case | points attached | hits per datagram | BPF ns per hit | BPF ns per datagram "
        "| sender µs per datagram |",
        "|---|---|---|---|---|---|"]


def cost_table(first: str, glob: str, sizes: list[int], n: int, reps: int) -> list[str]:
    lines = [f"Capture cost with many points on {os.uname().release}: {n} × 64-byte UDP on lo (a sink that never "
             f"reads: the datagrams are dropped), `{first}` then the matches of `{glob}`, kernel run-time stats on, "
             f"median of {reps}:", ""] + HEAD
    for k in sizes:
        m = _median([cost_once([first, glob], k, n) for _ in range(reps)])
        lines.append(_row(f"{k} point{'s' if k > 1 else ''}", m))
    return lines


def track_table(points: list[str], n: int, reps: int, filt: str = "udp") -> list[str]:
    """The tracking map's cost: the same points and filter with and without --track (a filter that matches
    nothing: what an untracked hit costs beside the filter's reject)."""
    lines = [f"Tracking cost on {os.uname().release}: {n} × 64-byte UDP on lo, points {', '.join(points)}, filter "
             f"'{filt}', median of {reps}:", ""] + HEAD
    for track in (False, True):
        m = _median([cost_once(points, None, n, filter=filt, track=track) for _ in range(reps)])
        lines.append(_row("--track" if track else "filter at every point", m))
    return lines


def retarget() -> list[str]:
    """Can one loaded fentry program attach to another function (BPF_LINK_CREATE with target_btf_id)?"""
    import errno as _errno

    from bpf import asm
    from bpf.prog import load
    from bpf.sys import LinkCreateAttr, bpf_errno
    from bpf.uapi import Cmd, ProgType
    from fcap.points.spec import resolve
    if not fentry_allowed():
        return [f"{os.uname().release}: fentry programs are refused here; nothing to re-target"]
    a, b = resolve("fentry/ip_output"), resolve("fentry/ip_finish_output")
    prog = load(ProgType.TRACING, [asm.movi(asm.R0, 0), asm.exit_()], name="retarget",
                expected_attach_type=AttachType.TRACE_FENTRY, attach_btf_id=a.btf_id)
    out = []
    with prog:
        for what, target in (("its own target (0)", 0), ("its own target by id", a.btf_id),
                             ("another function (ip_finish_output)", b.btf_id)):
            attr = LinkCreateAttr(prog_fd=prog.fileno(), attach_type=AttachType.TRACE_FENTRY, target_btf_id=target)
            fd, err = bpf_errno(Cmd.LINK_CREATE, attr)
            out.append(f"{os.uname().release}: LINK_CREATE of an fentry/ip_output program to {what}: "
                       f"{'a link' if fd >= 0 else _errno.errorcode.get(err, err)}")
            if fd >= 0:
                os.close(fd)
    return out


def _sizes(text: str) -> list[int | None]:
    return [None if x == "all" else int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.follow", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("attach")
    a.add_argument("globs", nargs="*")
    a.add_argument("--sizes", default="10,100,all")
    a.add_argument("--reps", type=int, default=3)
    c = sub.add_parser("cost")
    c.add_argument("--glob")
    c.add_argument("--first", default="tp_btf/net_dev_queue", help="the point the single-point case keeps")
    c.add_argument("--points", default="1,50")
    c.add_argument("-n", type=int, default=20000)
    c.add_argument("--reps", type=int, default=3)
    sub.add_parser("retarget")
    t = sub.add_parser("track")
    t.add_argument("--points", default="tp_btf/net_dev_queue,tp_btf/netif_receive_skb,tp_btf/kfree_skb")
    t.add_argument("-n", type=int, default=20000)
    t.add_argument("--reps", type=int, default=3)
    t.add_argument("--filter", default="udp", help="'host 192.0.2.1': no datagram on lo matches (untracked hits)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.follow: needs root", file=sys.stderr)
        return 2
    if args.what == "attach":
        attach_once((args.globs or default_globs())[0], 1)   # (warm: the BTF name index each start builds once)
        lines = attach_table(args.globs or default_globs(), _sizes(args.sizes), args.reps)
    elif args.what == "cost":
        glob = args.glob or ("fentry/ip_*" if fentry_allowed() else "tp_btf/*")
        lines = cost_table(args.first, glob, [int(x) for x in args.points.split(",")], args.n, args.reps)
    elif args.what == "retarget":
        lines = retarget()
    else:
        lines = track_table(args.points.split(","), args.n, args.reps, args.filter)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
