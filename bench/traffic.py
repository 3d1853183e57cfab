"""The traffic source: sender.c compiled with the machine's cc into a temporary directory, run pinned to a CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
SENDER_CPU, CAPTURE_CPU = 0, 1
RT_PRIORITY = 10         # SCHED_FIFO for the sender and the capture process (0: normal scheduling)


def pinned(cpu: int, argv: list[str]) -> list[str]:
    """argv run on one CPU, SCHED_FIFO at RT_PRIORITY when set: other work on the machine cannot take the CPU
    in the middle of a measurement."""
    rt = ["chrt", "-f", str(RT_PRIORITY)] if RT_PRIORITY else []
    return rt + ["taskset", "-c", str(cpu)] + argv
MAGIC = b"fcapbnch"      # the first payload bytes of every datagram the sender makes


class BenchError(Exception):
    """The benchmark cannot run here (a tool missing, not root, a child failing); str() says what."""


@dataclass
class Sent:
    packets: int
    ns: int
    port: int

    @property
    def pps(self) -> float:
        return self.packets * 1e9 / self.ns if self.ns else 0.0


class Sender:
    """Compiles bench/sender.c once (cc -O2) into a temporary directory removed by close(); $FCAP_BENCH_SENDER:
    one compiled before (a machine without a compiler, such as tests/vm's guests)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="fcap-bench-")
        self.path = os.path.join(self.dir, "sender")
        if os.environ.get("FCAP_BENCH_SENDER"):
            shutil.copy(os.environ["FCAP_BENCH_SENDER"], self.path)
            return
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            self.close()
            raise BenchError("no C compiler (cc): the sender is compiled at run time (or $FCAP_BENCH_SENDER)")
        r = subprocess.run([cc, "-O2", "-Wall", "-o", self.path, os.path.join(HERE, "sender.c")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.close()
            raise BenchError(f"compiling bench/sender.c: {r.stderr.strip()}")

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def send(self, payload: int, count: int, rate: float = 0, batch: int = 32) -> Sent:
        """Send `count` datagrams of `payload` bytes on 127.0.0.1 from CPU SENDER_CPU; rate 0 = full speed."""
        argv = pinned(SENDER_CPU, [self.path, str(payload), str(count), str(int(rate)), str(batch)])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise BenchError(f"sender failed: {r.stderr.strip()}")
        f = r.stdout.split()
        return Sent(int(f[1]), int(f[3]), int(f[5]))
