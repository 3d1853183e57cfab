"""Start-up: exec to `listening on` for fcap and tcpdump; `fcap list-devices` against bpftool's BTF dump. fcap's
"cold" runs start without its per-boot BTF caches (bpf.btf_cache), as the first run after a boot does."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

from . import capture
from .capture import Tool, running
from .traffic import CAPTURE_CPU, pinned


def drop_caches() -> None:
    """Remove fcap's per-boot BTF caches (the next fcap run makes them again)."""
    from bpf.btf_cache import cache_dir
    d = cache_dir()
    for name in os.listdir(d) if os.path.isdir(d) else []:
        if name.endswith(".btfcache"):
            os.unlink(os.path.join(d, name))


def interpreter_time(n: int) -> float:
    """Median wall time of `python3 -c pass`: the interpreter's own start with this environment's site hooks, the
    floor under fcap's start-up."""
    return statistics.median(wall_times([sys.executable, "-c", "pass"], n))


def ready_times(tool: Tool, n: int, cold: bool = False) -> list[float]:
    out = []
    path = os.path.join(capture.OUT_DIR[0], f"fcap-bench-ready-{os.getpid()}{tool.suffix}")
    for _ in range(n):
        if cold:
            drop_caches()
        with running(tool, path) as child:
            out.append(child.ready_at - child.t0)
            child.stop()
    return out


def wall_times(argv: list[str], n: int, cold: bool = False) -> list[float]:
    """Wall time of argv, n times, on the capture CPU with the same scheduling as the captures."""
    out = []
    for _ in range(n):
        if cold:
            drop_caches()
        t0 = time.monotonic()
        r = subprocess.run(pinned(CAPTURE_CPU, argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out.append(time.monotonic() - t0)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited with {r.returncode}")
    return out


def list_devices(fcap: list[str], n: int) -> dict[str, float | None]:
    res: dict[str, float | None] = {"fcap": statistics.median(wall_times(fcap + ["list-devices"], n)),
                                    "fcap cold": statistics.median(wall_times(fcap + ["list-devices"], n, cold=True))}
    bpftool = shutil.which("bpftool")
    res["bpftool"] = (statistics.median(wall_times([bpftool, "btf", "dump", "file", "/sys/kernel/btf/vmlinux"], n))
                      if bpftool else None)
    return res
