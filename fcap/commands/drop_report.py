"""`fcap drops [-w FILE] [FILTER] [-- COMMAND]`: every packet the kernel drops, counted per (reason, location) in a
BPF hash map at skb:drop's hook, printed as a table on exit (as dropwatch does); with -w the drops are captured too."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import time

from bpf.asm import (DW, FP, JEQ, R0, R1, R2, R3, R4, R6, addi, atomic_add, call, exit_, ja, jmp, label, ld_map_fd,
                     ldx, mov, movi, st)
from bpf.errors import BPFError
from bpf.maps import HashMap
from bpf.uapi import Helper, UpdateFlags

from fcap.kernel import drops
from fcap.errors import CaptureError, CommandError
from fcap.kernel.layout import DROP_KEY, STACK
from fcap.points.spec import Point

MAX_KEYS = 4096   # (reason, location) pairs counted; more are counted as "other" by the kernel refusing them


def program(p: Point, counts_fd: int) -> list:
    """count[(reason, location)] += 1 at the drop point p (reason 0 where the point has none)."""
    reason, location = drops.reason_arg(p), drops.location_arg(p)
    items = [mov(R6, R1), st(DW, FP, STACK.drop_key, 0), st(DW, FP, STACK.drop_key + 8, 0)]
    for field, index in (("reason", reason), ("location", location)):
        if index is not None:
            items += [ldx(DW, R0, R6, 8 * index), DROP_KEY.store(FP, field, R0, STACK.drop_key)]
    lookup = [ld_map_fd(R1, counts_fd), mov(R2, FP), addi(R2, STACK.drop_key), call(Helper.map_lookup_elem)]
    items += lookup + [jmp(JEQ, R0, 0, "new"), movi(R1, 1), atomic_add(DW, R0, 0, R1), ja("out"),
                       label("new"), st(DW, FP, STACK.drop_one, 1), ld_map_fd(R1, counts_fd), mov(R2, FP),
                       addi(R2, STACK.drop_key), mov(R3, FP), addi(R3, STACK.drop_one), movi(R4, UpdateFlags.NOEXIST),
                       call(Helper.map_update_elem), jmp(JEQ, R0, 0, "out")]
    # another CPU put the key in first (or the map is full: then the lookup misses and the drop goes uncounted)
    items += lookup + [jmp(JEQ, R0, 0, "out"), movi(R1, 1), atomic_add(DW, R0, 0, R1)]
    return items + [label("out"), movi(R0, 0), exit_()]


class Counter:
    """The counting program at skb:drop's hook on this kernel, its map, and the table it makes."""

    def __init__(self) -> None:
        from fcap.points.semantic import resolve_semantic
        self.point = resolve_semantic("skb:drop")[0]
        if not drops.is_drop_point(self.point) or self.point.kind.function:
            raise CaptureError(f"fcap drops counts at the kfree_skb tracepoint; this kernel serves skb:drop with "
                               f"{self.point.spec}")
        self.map: HashMap | None = None
        self.prog = None
        self.link = None

    def start(self) -> None:
        from bpf.link import attach_tracing
        from bpf.prog import load
        from bpf.uapi import AttachType, ProgType
        try:
            self.map = HashMap(DROP_KEY.size, 8, MAX_KEYS, name="fcap_drops")
            self.prog = load(ProgType.TRACING, program(self.point, self.map.fileno()), name="fcap_drops",
                             expected_attach_type=AttachType.TRACE_RAW_TP, attach_btf_id=self.point.btf_id,
                             what=f"count drops at {self.point.spec}")
            self.link = attach_tracing(self.prog.fileno(), self.point.spec)
        except BPFError as e:
            self.close()
            raise CaptureError(f"fcap drops: {e}") from None

    def counts(self) -> list[tuple[int, int, int]]:
        """(count, reason, location), most first."""
        out = []
        for k, v in self.map.items():
            key = DROP_KEY.unpack(k)
            out.append((int.from_bytes(v[:8], "little"), key.reason, key.location))
        return sorted(out, key=lambda t: (-t[0], t[1], t[2]))

    def close(self) -> None:
        for o in (self.link, self.prog, self.map):
            if o is not None:
                o.close()
        self.link = self.prog = self.map = None


def table(counts: list[tuple[int, int, int]], names: drops.Names, has_reason: bool) -> str:
    """The drops as dropwatch shows them: count, reason, where."""
    total = sum(c for c, _r, _l in counts)
    lines = [f"{total} packet{'s' if total != 1 else ''} dropped"]
    if counts:
        rows = [(str(c), names.reason(r) if has_reason else "-", names.location(loc)) for c, r, loc in counts]
        w = [max(len(r[i]) for r in rows + [("count", "reason", "location")]) for i in range(3)]
        lines.append(f"{'count':>{w[0]}}  {'reason':<{w[1]}}  location")
        lines += [f"{c:>{w[0]}}  {r:<{w[1]}}  {loc}" for c, r, loc in rows]
    return "\n".join(lines) + "\n"


def wait(command: list[str]) -> int:
    """Run COMMAND and wait for it, or (none) wait for SIGINT/SIGTERM; the status to exit with."""
    stop = []

    def on_signal(signum, frame):
        stop.append(signum)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if not command:
        while not stop:
            time.sleep(0.1)
        return 0
    try:
        proc = subprocess.Popen(command)
    except OSError as e:
        raise CommandError(f"{command[0]}: {e.strerror or errno.errorcode.get(e.errno, e)}") from None
    while proc.poll() is None and not stop:
        time.sleep(0.05)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 0
    rc = proc.returncode
    return rc if rc >= 0 else 128 - rc


def write_table(counter: Counter, out=sys.stdout) -> None:
    out.write(table(counter.counts(), drops.Names(), drops.reason_arg(counter.point) is not None))
    out.flush()
