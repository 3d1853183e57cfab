"""Attach and detach time for 1, 100, 1,000 and every skb function (fcap.live.multi): the same capture sessions fcap
runs, timed from open (build and load) through attach, and from detach through close, as ratios to one function
within one run, with functions attached per second and where the attach time goes (BTF, build, verification, links,
the rest), the kernel's own part (one link, a program that does nothing) and the fcap command's time to
'listening on' and back; then a sender's rate with every function attached and a filter that matches nothing (with
and without --track) against the same sender with nothing attached, with the programs' own run time per hit. Run as
root where fentry or kprobes work (the guests):
python3 -m bench.multi_attach [KIND] [--per-point] [--no-rate] [--sizes=1,100,1000,all]
(KIND fentry or kprobe; --per-point: a program per point)."""

from __future__ import annotations

import collections
import socket
import sys
import time

NOTHING = "host 192.0.2.1"   # a filter no datagram on lo matches (TEST-NET-1)
SEND_S = 3.0                 # seconds each sender rate is measured over


class Phases:
    """Seconds spent in named session steps (wrapped methods), summed over calls."""

    STEPS = (("fcap.live.session", "Session", "resolve", "BTF"), ("fcap.live.session", "Session", "build", "build"),
             ("fcap.live.session", "Session", "_load", "verify"), ("fcap.points.kinds", None, "attach_tracing_multi",
                                                                  "links"),
             ("fcap.points.kinds", None, "attach_kprobe_multi", "links"), ("fcap.live.multi", None, "traceable",
                                                                          "ftrace list"),
             # detach and close
             ("fcap.live.session", "Session", "detach", "unlink"), ("fcap.live.session", "Session", "read_counters",
                                                                    "counters"),
             ("fcap.live.session", None, "wait_freed", "programs freed"))
    DETACH = ("unlink", "counters", "programs freed")

    def __init__(self):
        import importlib
        self.seconds: dict[str, float] = collections.defaultdict(float)
        for module, cls, name, label in self.STEPS:
            owner = importlib.import_module(module)
            owner = getattr(owner, cls) if cls else owner
            setattr(owner, name, self._timed(getattr(owner, name), label))

    def _timed(self, f, label: str):
        def timed(*a, **k):
            t = time.monotonic()
            try:
                return f(*a, **k)
            finally:
                self.seconds[label] += time.monotonic() - t
        return timed

    def text(self, total: float, detach: bool = False) -> str:
        mine = {label: s for label, s in self.seconds.items() if (label in self.DETACH) == detach}
        parts = [f"{label} {s:.2f}" for label, s in sorted(mine.items(), key=lambda x: -x[1]) if s >= 0.005]
        rest = total - sum(mine.values())
        return ", ".join(parts + [f"rest {rest:.2f}"])


def one(specs: list[str], per_point: bool, phases: Phases | None = None, hold=None, **cfg):
    """(seconds to attach, seconds to detach and close, points attached, links, what `hold(session)` returned) of
    one session at `specs`; a function the kernel refuses (an error when named on its own) is taken out and the
    session made again."""
    from fcap.errors import CaptureError
    from fcap.live import multi
    from fcap.live.session import Config, Session
    while True:
        s = Session(Config(points=specs, **cfg))
        if phases is not None:
            phases.seconds.clear()
        t0 = time.monotonic()
        s.resolve()
        if per_point:
            s.plan = lambda: [multi.Group(None, [p]) for p in s.points]
        try:
            s.open()
            s.attach()
            break
        except CaptureError as e:
            bad = str(e).split(":", 1)[0]
            if bad not in specs:
                raise
            specs = [x for x in specs if x != bad]
    t1 = time.monotonic()
    attached, links = len(s.points) - len(s.unattached), len(s.links)
    held = hold(s) if hold is not None else None
    t2 = time.monotonic()
    s.close()
    return t1 - t0, time.monotonic() - t2, attached, links, held


def attached_points(s) -> list:
    """The points a session attached (a hold for one())."""
    return [p for p in s.points if p.id not in s.unattached]


def kernel_floor(kind: str, points: list) -> tuple[float, float]:
    """(seconds to make, seconds to close) one multi-attach link at `points` with a program that does nothing
    (loaded before the clock starts): the kernel's own part of attaching them, the floor under fcap's."""
    from bpf.asm import R0, exit_, movi
    from bpf.prog import load
    from fcap.live import multi
    from fcap.points import kinds
    m = multi.multi_kind(kinds.FENTRY if kind == "fentry" else kinds.KPROBE)
    prog = load(m.prog_type, [movi(R0, 0), exit_()], name="fcap_floor", expected_attach_type=m.load_attach_type())
    try:
        t0 = time.monotonic()
        link = m.attach_many(prog.fileno(), points, list(range(len(points))))
        t1 = time.monotonic()
        link.close()
        return t1 - t0, time.monotonic() - t1
    finally:
        prog.close()


def to_listening(spec: str, runs: int = 3) -> tuple[float, float]:
    """(seconds from starting the fcap command to its 'listening on' line, seconds from SIGINT to its exit): the
    median of `runs`, as a user waits for them (Python's start, BTF, build, load and attach; detach and close)."""
    import os
    import signal
    import subprocess
    ups, downs = [], []
    for _ in range(runs):
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-m", "fcap", "-i", spec, "-w", os.devnull], stderr=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, text=True)
        for line in p.stderr:
            if line.startswith("listening on"):
                break
        ups.append(time.monotonic() - t0)
        t1 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=600)
        downs.append(time.monotonic() - t1)
    return sorted(ups)[len(ups) // 2], sorted(downs)[len(downs) // 2]


def send_rate(seconds: float = SEND_S) -> float:
    """Datagrams per second one socket sends on lo (64 bytes, to a sink that never reads: they are dropped)."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sink.bind(("127.0.0.1", 0))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(sink.getsockname())
    data, n = b"\x5a" * 64, 0
    t0 = time.monotonic()
    end = t0 + seconds
    while True:
        for _ in range(100):
            s.send(data)
        n += 100
        if time.monotonic() >= end:
            break
    rate = n / (time.monotonic() - t0)
    s.close()
    sink.close()
    return rate


def loaded_rate(s) -> tuple[float, float, float]:
    """(datagrams per second, the capture programs' hits per datagram, their ns per hit) with `s` attached."""
    from bpf.sys import enable_stats
    progs = s.programs + [prog for _p, prog in s.helpers]
    with enable_stats():
        before = [p.stats() for p in progs]
        rate = send_rate()
        after = [p.stats() for p in progs]
    ns = sum(a.run_time_ns - b.run_time_ns for a, b in zip(after, before))
    hits = sum(a.run_cnt - b.run_cnt for a, b in zip(after[:len(s.programs)], before))
    sent = rate * SEND_S
    return rate, hits / sent, ns / hits if hits else 0.0


def rates(kind: str) -> list[str]:
    """The sender's rate bare and with every function attached (a filter matching nothing; then --track too)."""
    lines = []
    bare = send_rate()
    for label, cfg in (("filter", {}), ("filter, --track", {"track": True})):
        _up, _down, attached, links, (rate, hits, ns) = one([f"{kind}/*"], False, hold=loaded_rate, filter=NOTHING,
                                                             **cfg)
        lines.append(f"  {attached} functions, {links} links, '{NOTHING}' ({label}): {rate:8.0f} datagrams/s, "
                     f"{rate / bare:5.2f}x bare; {hits:5.1f} hits per datagram, {ns:6.0f} ns per hit")
    again = send_rate()
    lines.insert(0, f"  bare: {bare:8.0f} datagrams/s (after: {again:8.0f})")
    return lines


def main(argv: list[str]) -> int:
    from fcap.points.spec import list_points
    kind = next((a for a in argv if not a.startswith("-")), "fentry")
    per_point = "--per-point" in argv
    from fcap.live import multi
    traceable = multi.traceable() or set()
    names = [i.name for i in list_points() if i.kind == "fentry" and i.module == "vmlinux" and i.name in traceable]
    names = list(dict.fromkeys(names))
    phases = Phases()
    one([f"{kind}/{names[0]}"], per_point)   # (once before: the kernel's features are probed by the first session)
    base = None
    print(f"{kind}, {'a program per point' if per_point else 'multi-attach where the kernel has it'}:")
    sizes = next((a.split("=", 1)[1] for a in argv if a.startswith("--sizes=")), "1,100" if per_point else
                 "1,100,1000,all")   # (a program per point: the figures for all, 104.6 s on 7.2, 86.5 s on 6.1)
    for n in [len(names) if x == "all" else int(x) for x in sizes.split(",")]:
        specs = [f"{kind}/{f}" for f in names[:n]] if n < len(names) else [f"{kind}/*"]
        up, down, attached, links, pts = one(specs, per_point, phases, hold=attached_points)
        where = f"      attach: {phases.text(up)}\n      detach: {phases.text(down, detach=True)}"
        if n == 1:   # (the ratios' base: the median of five, one session is at the mercy of a busy host)
            runs = sorted([(up, down)] + [one(specs, per_point)[:2] for _ in range(4)])
            up, down = runs[2]
            where += " (the first of the five)"
        base = base or up
        print(f"  {n:5} functions: attach {up:7.2f} s ({up / base:6.1f}x one), {attached / up:7.1f} functions/s, "
              f"{links} links; detach {down:6.2f} s\n{where}", flush=True)
        if not per_point and n > 1:
            make, close = kernel_floor(kind, pts)
            print(f"      the kernel alone (one link at the {len(pts)} functions, a program that does nothing): "
                  f"make {make:.2f} s ({make / base:.1f}x one), close {close:.2f} s", flush=True)
    if not per_point:
        one_up, one_down = to_listening(f"{kind}/{names[0]}")
        all_up, all_down = to_listening(f"{kind}/*")
        print(f"the fcap command, to 'listening on' and from Ctrl-C to its exit (median of 3): one function "
              f"{one_up:.2f} s / {one_down:.2f} s; every function {all_up:.2f} s ({all_up / one_up:.1f}x) / "
              f"{all_down:.2f} s ({all_down / one_down:.1f}x)", flush=True)
    if not per_point and "--no-rate" not in argv:
        print("\n".join(["a sender on lo, every function attached:"] + rates(kind)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
