"""One capture run: start a capture tool pinned to a CPU, wait for `listening on`, send, stop it with SIGINT,
then collect its CPU time (wait4 rusage), its own summary lines and the share of the traffic in its file."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .traffic import CAPTURE_CPU, MAGIC, BenchError, Sender, pinned

SNAPLEN = 128
POINT = "tp_btf/net_dev_queue"
OUT_DIR = ["/dev/shm"]     # where the capture files go (python -m bench --dir)
CLK_TCK = os.sysconf("SC_CLK_TCK")


FCAP: list[str] = []     # how to run fcap when not the default (python -m bench --fcap 'CMD')


def fcap_argv() -> list[str]:
    """The installed `fcap` script next to this Python (not a version manager's shim on PATH, such as pyenv's,
    which adds a shell and ~80 ms to every start), else the one on PATH, else the module."""
    if FCAP:
        return list(FCAP)
    here = os.path.join(os.path.dirname(sys.executable), "fcap")
    exe = here if os.access(here, os.X_OK) else shutil.which("fcap")
    return [exe] if exe else [sys.executable, "-m", "fcap.commands.cli"]


@dataclass
class Tool:
    """A capture configuration: name, how to run it (FILE stands for the output path), the file's suffix."""

    name: str
    argv: list[str]
    suffix: str = ".pcap"
    ready: str = "listening on"   # the line that says it captures
    prints: bool = False          # its lines on stdout, into FILE (argv has no FILE then)

    def command(self, path: str) -> list[str]:
        return [path if a == "FILE" else a for a in self.argv]

    def shown(self) -> str:
        return " ".join("FILE" + self.suffix if a == "FILE" else os.path.basename(a) if i == 0 else a
                        for i, a in enumerate(self.argv))


def tools(extra_fcap: list[str] | None = None) -> dict[str, Tool]:
    fc = fcap_argv() + ["-i", POINT, "-s", str(SNAPLEN)] + (extra_fcap or [])
    return {
        "tcpdump": Tool("tcpdump", ["tcpdump", "-i", "lo", "-s", str(SNAPLEN), "-w", "FILE"]),
        "fcap pcap": Tool("fcap pcap", fc + ["-w", "FILE"], ".pcap"),
        "dumpcap": Tool("dumpcap", ["dumpcap", "-i", "lo", "-s", str(SNAPLEN), "-w", "FILE"], ".pcapng",
                        ready="Capturing on"),
        "fcap pcapng": Tool("fcap pcapng", fc + ["-w", "FILE"], ".pcapng"),
        # printed lines into a file (stdout), a line per packet, flushed per line as a pipe into grep asks
        "tcpdump -nn": Tool("tcpdump -nn", ["tcpdump", "-i", "lo", "-s", str(SNAPLEN), "-nn", "-l"], ".txt",
                            prints=True),
        "fcap -nn": Tool("fcap -nn", fc + ["-nn", "-l"], ".txt", prints=True),
        # -v: each packet's IP header on a line, its ports and length on the next (counted by that one)
        "tcpdump -nn -v": Tool("tcpdump -nn -v", ["tcpdump", "-i", "lo", "-s", str(SNAPLEN), "-nn", "-v", "-l"],
                               ".txt", prints=True),
        "fcap -nn -v": Tool("fcap -nn -v", fc + ["-nn", "-v", "-l"], ".txt", prints=True),
        "fcap --json": Tool("fcap --json", fc + ["--json", "-l"], ".json", prints=True),   # (a JSON object a line)
    }


@dataclass
class Result:
    tool: str                  # "none" for the bare sender
    payload: int
    rate: float                # asked for; 0 = full speed
    sent: int = 0
    sender_pps: float = 0.0
    in_file: int = 0           # the sender's datagrams found in the file (distinct sequence numbers)
    captured: int | None = None     # the tool's own three summary lines
    received: int | None = None
    dropped: int | None = None
    cpu_run_s: float = 0.0     # capture-process CPU (user+sys) from `listening on` to exit
    cpu_start_s: float = 0.0   # capture-process CPU before `listening on`
    ready_s: float = 0.0       # exec to `listening on`
    bpf_ns_per_hit: float | None = None
    bpf_hits: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.in_file / self.sent if self.sent else 0.0

    @property
    def cpu_us_per_pkt(self) -> float | None:
        return self.cpu_run_s * 1e6 / self.in_file if self.in_file else None


def _ticks(path: str) -> int:
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _proc_cpu_s(pid: int) -> float:
    """CPU time of a running process, its threads that have ended included (as wait4 counts them at its exit):
    the live threads' schedstat ns, plus the ticks of those gone (the process's ticks less the live threads'),
    else stat's ticks alone."""
    total = ticks = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
            ticks += _ticks(f"/proc/{pid}/task/{tid}/stat")
        return total / 1e9 + max(_ticks(f"/proc/{pid}/stat") - ticks, 0) / CLK_TCK
    except (OSError, ValueError, IndexError):
        pass
    return _ticks(f"/proc/{pid}/stat") / CLK_TCK


class _Child:
    """A capture process whose stderr is read by a thread; ready() waits for its `listening on` line."""

    def __init__(self, argv: list[str], ready: str = "listening on", launch: list[str] | None = None,
                 stdout: str | None = None):
        """launch: what runs argv (default: pinned to CAPTURE_CPU, SCHED_FIFO); stdout: a file for its output."""
        self.lines: list[str] = []
        self.ready_line = ready
        self.t0 = time.monotonic()
        self.argv = argv
        with open(stdout, "wb") if stdout else contextlib.nullcontext(subprocess.DEVNULL) as out:
            self.p = subprocess.Popen(pinned(CAPTURE_CPU, argv) if launch is None else launch + argv,
                                      stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, cwd=OUT_DIR[0])
        self.ready_at: float | None = None
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for raw in self.p.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            with self.cv:
                if self.ready_at is None and self.ready_line in line:
                    self.ready_at = time.monotonic()
                self.lines.append(line)
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def ready(self, timeout: float = 30) -> float:
        with self.cv:
            ok = self.cv.wait_for(lambda: self.ready_at is not None or self.p.poll() is not None, timeout)
        if self.ready_at is None:
            self.kill()
            why = "exited" if ok else f"said nothing for {timeout:.0f} s"
            raise BenchError(f"{os.path.basename(self.argv[0])} {why} before `listening on`: "
                             + " | ".join(self.lines[-5:]))
        return self.ready_at - self.t0

    def stop(self) -> tuple[float, list[str]]:
        """SIGINT, then wait; returns (user+sys CPU seconds of the whole life, stderr lines)."""
        self.p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 120
        while True:
            pid, status, ru = os.wait4(self.p.pid, os.WNOHANG)
            if pid:
                self.p.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"{os.path.basename(self.argv[0])} did not stop within 120 s of SIGINT")
            time.sleep(0.01)
        self.thread.join(5)
        return ru.ru_utime + ru.ru_stime, self.lines

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


@contextlib.contextmanager
def running(tool: Tool, path: str, launch: list[str] | None = None):
    """The tool capturing into `path` for the block, ready (`listening on`): its _Child; killed if still running
    and the file removed after."""
    child = _Child(tool.command(path), tool.ready, launch=launch, stdout=path if tool.prints else None)
    try:
        child.ready()
        yield child
    finally:
        child.kill()
        try:
            os.unlink(path)
        except OSError:
            pass


_SUMMARY = re.compile(r"^(\d+) packets? (captured|received by filter|dropped by kernel)")


_DUMPCAP = re.compile(r"^Packets received/dropped on interface .*: (\d+)/(\d+)")


def _summary(lines: list[str], r: Result) -> None:
    for line in lines:
        m = _DUMPCAP.match(line)
        if m:   # dumpcap's own line: received / dropped (all of them written)
            r.received = r.captured = int(m.group(1))
            r.dropped = int(m.group(2))
            continue
        m = _SUMMARY.match(line)
        if m:
            n = int(m.group(1))
            if m.group(2) == "captured":
                r.captured = n
            elif m.group(2) == "received by filter":
                r.received = n
            else:
                r.dropped = n


def count_in_file(path: str, port: int | set) -> int:
    """Distinct sequence numbers of the sender's datagrams (to `port`, or to each port of a set: a datagram is
    its port and number) in a pcap or pcapng file (EN10MB); in printed lines (a .txt file), the lines of
    datagrams to the port(s); in JSON lines (a .json file), the objects of datagrams to the port(s)."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith((".txt", ".json")):
        form = '"dport":{}}}' if path.endswith(".json") else ".{}: UDP, length"
        ends = tuple(form.format(p).encode() for p in (port if isinstance(port, set) else {port}))
        return sum(1 for line in data.splitlines() if any(e in line for e in ends))
    seen = set()
    link = _link_header(data)
    magic_at, dport_at = link + 20 + 8, link + 20 + 2
    dports = {struct.pack(">H", p) for p in (port if isinstance(port, set) else {port})}
    for rec in _records(data):
        if rec[magic_at:magic_at + 8] == MAGIC and rec[dport_at:dport_at + 2] in dports:
            seen.add(bytes(rec[dport_at:dport_at + 2]) + rec[magic_at + 8:magic_at + 16])
    return len(seen)


LINK_HEADER = {1: 14, 113: 16, 276: 20}   # EN10MB, LINUX_SLL, LINUX_SLL2 (a drop point's)


def _link_header(data: bytes) -> int:
    """The length of the link header of the file's (first interface's) link type."""
    if data[:4] == b"\n\r\r\n":
        total = struct.unpack_from("<I", data, 4)[0]   # (the section header; the first interface's block next)
        linktype = struct.unpack_from("<H", data, total + 8)[0] if len(data) >= total + 10 else 1
    else:
        linktype = struct.unpack_from("<I", data, 20)[0] if len(data) >= 24 else 1
    if linktype not in LINK_HEADER:
        raise BenchError(f"link type {linktype}: not one the bench counts datagrams in")
    return LINK_HEADER[linktype]


def _records(data: bytes):
    mv = memoryview(data)
    if data[:4] == b"\n\r\r\n":
        off = 0
        unpack = struct.Struct("<II").unpack_from
        while off + 12 <= len(data):
            btype, total = unpack(mv, off)
            if total < 12:
                raise BenchError("damaged pcapng file")
            if btype == 6:
                caplen = struct.unpack_from("<I", mv, off + 20)[0]
                yield mv[off + 28:off + 28 + caplen]
            off += total
        return
    if data[:4] not in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        raise BenchError(f"not a little-endian pcap/pcapng file: {data[:4].hex()}")
    off = 24
    unpack = struct.Struct("<8xI4x").unpack_from
    while off + 16 <= len(data):
        (caplen,) = unpack(mv, off)
        yield mv[off + 16:off + 16 + caplen]
        off += 16 + caplen


def run_one(sender: Sender, tool: Tool | None, payload: int, count: int, rate: float = 0, batch: int = 32,
            settle: float = 1.2, bpf_stats: bool = False) -> Result:
    """One run: the bare sender when tool is None."""
    name = tool.name if tool else "none"
    r = Result(name, payload, rate)
    if tool is None:
        s = sender.send(payload, count, rate, batch)
        r.sent, r.sender_pps = s.packets, s.pps
        return r
    path = os.path.join(OUT_DIR[0], f"fcap-bench-{os.getpid()}{tool.suffix}")
    child = _Child(tool.command(path), tool.ready)
    stats = None
    try:
        r.ready_s = child.ready()
        cpu0 = _proc_cpu_s(child.p.pid)
        r.cpu_start_s = cpu0
        if bpf_stats:
            from .bpfstats import ProgramStats
            stats = ProgramStats(child.p.pid)
        s = sender.send(payload, count, rate, batch)
        r.sent, r.sender_pps = s.packets, s.pps
        time.sleep(settle)
        if stats is not None:
            r.bpf_ns_per_hit, r.bpf_hits = stats.per_hit()
        cpu, lines = child.stop()
        r.cpu_run_s = max(cpu - cpu0, 0.0)
        _summary(lines, r)
        if child.p.returncode not in (0, -signal.SIGINT, 130):
            r.notes.append(f"exit status {child.p.returncode}: {' | '.join(lines[-3:])}")
        r.in_file = count_in_file(path, s.port)
    finally:
        if stats is not None:
            stats.close()
        child.kill()
        try:
            os.unlink(path)
        except OSError:
            pass
    return r
