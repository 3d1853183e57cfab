"""Attach and detach time for 1, 100, 1,000 and every skb function (fcap.live.multi): the same capture sessions fcap
runs, timed from open (build and load) through attach, and from detach through close, as ratios to one function
within one run, with functions attached per second. Run as root where fentry or kprobes work (the guests):
python3 -m bench.multi_attach [KIND] [--per-point] (KIND fentry or kprobe; --per-point: a program per point)."""

from __future__ import annotations

import sys
import time


def one(specs: list[str], per_point: bool) -> tuple[float, float, int, int]:
    """(seconds to attach, seconds to detach and close, points attached, links) of one session at `specs`; a
    function the kernel refuses (an error when named on its own) is taken out and the session made again."""
    from fcap.errors import CaptureError
    from fcap.live import multi
    from fcap.live.session import Config, Session
    while True:
        s = Session(Config(points=specs))
        t0 = time.monotonic()
        s.resolve()
        if per_point:
            s.plan = lambda: [multi.Unit(None, [p]) for p in s.points]
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
    s.close()
    return t1 - t0, time.monotonic() - t1, attached, links


def main(argv: list[str]) -> int:
    from fcap.points.spec import list_points
    kind = next((a for a in argv if not a.startswith("-")), "fentry")
    per_point = "--per-point" in argv
    from fcap.live import multi
    traceable = multi.traceable() or set()
    names = [i.name for i in list_points() if i.kind == "fentry" and i.module == "vmlinux" and i.name in traceable]
    names = list(dict.fromkeys(names))
    base = None
    print(f"{kind}, {'a program per point' if per_point else 'multi-attach where the kernel has it'}:")
    for n in (1, 100) if per_point else (1, 100, 1000, len(names)):   # (a program per point: the figures
        #                                                                    for all of them, 104.6 s on 7.2, 86.5 s on 6.1)
        specs = [f"{kind}/{f}" for f in names[:n]] if n < len(names) else [f"{kind}/*"]
        up, down, attached, links = one(specs, per_point)
        base = base or up
        print(f"  {n:5} functions: attach {up:7.2f} s ({up / base:6.1f}x one), {attached / up:7.1f} functions/s, "
              f"{links} links; detach {down:6.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
