"""BPF run time per hit of the programs a capture process holds: kernel run-time stats (BPF_ENABLE_STATS) on for
the duration, programs found through the process's /proc/PID/fdinfo (prog_id)."""

from __future__ import annotations

import os

from bpf.sys import FD, GetIdAttr, ProgInfo, bpf, enable_stats, obj_info
from bpf.uapi import Cmd


def program_ids(pid: int) -> list[int]:
    ids = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.append(int(line.split()[1]))
        except OSError:
            continue
    return sorted(set(ids))


def _totals(fds: list[FD]) -> tuple[int, int]:
    ns = cnt = 0
    for fd in fds:
        info = obj_info(fd.fd, ProgInfo(), "read program stats")
        ns += info.run_time_ns
        cnt += info.run_cnt
    return ns, cnt


class ProgramStats:
    """Stats on from now; per_hit() = (run time ns / runs, runs) of pid's programs since then."""

    def __init__(self, pid: int):
        self.fds = [FD(bpf(Cmd.PROG_GET_FD_BY_ID, GetIdAttr(start_id=i), f"open program {i}"))
                    for i in program_ids(pid)]
        self.stats = enable_stats()
        self.start = _totals(self.fds)

    def per_hit(self) -> tuple[float | None, int]:
        ns, cnt = _totals(self.fds)
        ns, cnt = ns - self.start[0], cnt - self.start[1]
        return (ns / cnt if cnt else None), cnt

    def close(self) -> None:
        self.stats.close()
        for fd in self.fds:
            fd.close()
