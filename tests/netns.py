"""Helpers for the end-to-end tests: running fcap and tcpdump until they are listening, traffic generators,
reading capture files, and a veth pair into a network namespace.

Traffic goes only to 127.0.0.0/8, ::1, or to a namespace these helpers create (198.18.0.0/15 addresses)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from packets import (  # noqa: F401 - the tests import the readers from here too
    ETH_HLEN, LINKTYPE_EN10MB, LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL2, LINKTYPE_RAW, Flow, Pkt, ethertype,
    flow_of, l4_payload, read_packets)

ROOT = Path(__file__).resolve().parent.parent
# Under tests/vm/run the guest is emulated (TCG): everything is several times slower there.
SLOW = 6.0 if os.environ.get("FCAP_VM") else 1.0
READY_TIMEOUT = 30.0 * SLOW   # generous: BTF parsing and program loads take a while
EXIT_TIMEOUT = 30.0 * SLOW


def fcap_argv() -> list[str]:
    """How to run fcap: the installed command when it is on PATH, else the module from this checkout."""
    exe = shutil.which("fcap")
    return [exe] if exe else [sys.executable, "-m", "fcap.commands.cli"]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("LC_ALL", "C.UTF-8")
    return env


# ---- processes that announce readiness on stderr ----------------------------------------------------

class Proc:
    """A child whose stderr is read line by line in a thread, so a test can wait for a line and still see all
    of it at the end. stdout goes where the caller says (a file, a pipe, DEVNULL)."""

    def __init__(self, argv: list[str], stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, name: str = "",
                 **kw):
        self.argv = argv
        self.name = name or os.path.basename(argv[0])
        kw.setdefault("env", subprocess_env())
        self.p = subprocess.Popen(argv, stdout=stdout, stdin=stdin, stderr=subprocess.PIPE, **kw)
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for raw in self.p.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    @property
    def pid(self) -> int:
        return self.p.pid

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = READY_TIMEOUT) -> str:
        """The first stderr line matching `pattern` (a regex); fails with what the process said otherwise."""
        rx = re.compile(pattern)
        for line in list(self.lines):
            if rx.search(line):
                return line
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no line matching {pattern!r} within {timeout}s; "
                                     f"stderr so far:\n{self.stderr}")
            try:
                line = self._q.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.p.wait(timeout=EXIT_TIMEOUT)
                raise AssertionError(f"{self.name} exited with status {self.p.returncode} before printing "
                                     f"{pattern!r}; stderr:\n{self.stderr}")
            if rx.search(line):
                return line

    def stop(self, sig: int = signal.SIGINT, timeout: float = EXIT_TIMEOUT) -> int:
        """Send `sig` (if still running), wait for the exit and the end of stderr; returns the exit status."""
        if self.p.poll() is None:
            try:
                self.p.send_signal(sig)
            except ProcessLookupError:
                pass
        return self.wait(timeout)

    def wait(self, timeout: float = EXIT_TIMEOUT) -> int:
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.send_signal(signal.SIGINT)   # (its own summary, what it counted and lost, into the message)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.p.wait(timeout=10)
            self.kill()
            self._t.join(timeout=5)
            raise AssertionError(f"{self.name} did not exit within {timeout}s; stderr (with what SIGINT then "
                                 f"made it say):\n{self.stderr}") from None
        self._t.join(timeout=5)
        return self.p.returncode

    def kill(self) -> None:
        """Last resort (finally clauses): SIGKILL this child only."""
        if self.p.poll() is None:
            try:
                self.p.kill()
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for f in (self.p.stdout, self.p.stdin):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


def start_fcap(args: list[str], ready: bool = True, netns: str | None = None, **kw) -> Proc:
    """Start fcap with `args` (in namespace `netns`: ip netns exec) and (by default) wait until it says it is
    listening (programs attached)."""
    p = Proc((["ip", "netns", "exec", netns] if netns else []) + fcap_argv() + args, name="fcap", **kw)
    if ready:
        try:
            p.wait_for(r"^listening on ")
        except BaseException:
            p.kill()
            raise
    return p


def start_tcpdump(iface: str, path: str | os.PathLike, *extra: str, netns: str | None = None,
                  snaplen: int = 262144) -> Proc:
    """tcpdump -i IFACE -w PATH, started and waited for until it is listening."""
    argv = ["tcpdump", "-i", iface, "-w", str(path), "-s", str(snaplen), "-nn", "-U", "-B", "16384",
            "--immediate-mode", *extra]
    if netns:
        argv = ["ip", "netns", "exec", netns] + argv
    p = Proc(argv, name="tcpdump")
    try:
        p.wait_for(r"listening on ")
    except BaseException:
        p.kill()
        raise
    return p


def run_fcap(args: list[str], timeout: float = 60 * SLOW, **kw) -> subprocess.CompletedProcess:
    """Run fcap to completion (for errors, list-devices, info, -r, --dump-ebpf)."""
    kw.setdefault("env", subprocess_env())
    return subprocess.run(fcap_argv() + args, capture_output=True, timeout=timeout, **kw)


# ---- traffic -----------------------------------------------------------------------------------------

def free_port(family: int = socket.AF_INET, kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(family, kind) as s:
        s.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        return s.getsockname()[1]


def udp_sizes(seed: int, n: int = 40, big: int = 6) -> list[int]:
    """Seeded payload sizes: mostly 1..1400, a few up to ~8000."""
    rnd = random.Random(seed)
    sizes = [rnd.randint(1, 1400) for _ in range(n)] + [rnd.randint(1401, 8000) for _ in range(big)]
    rnd.shuffle(sizes)
    return sizes


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed * 1_000_003 + size).randbytes(size)


def send_udp(dst: str, port: int, payloads: list[bytes], src_port: int = 0, pace: float = 0.0) -> int:
    """Send each payload as one datagram to (dst, port) from a socket bound to src_port (0: any)."""
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.bind(("::1" if family == socket.AF_INET6 and dst == "::1" else
                "" if family == socket.AF_INET6 else "0.0.0.0", src_port))
        for p in payloads:
            s.sendto(p, (dst, port))
            if pace:
                time.sleep(pace)
        return s.getsockname()[1]


class UDPSink:
    """A bound UDP socket that receives (and counts) datagrams in a thread, so nothing is ICMP-unreachable."""

    def __init__(self, addr: str = "127.0.0.1", port: int = 0):
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((addr, port))
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            self.received.append(data)

    def wait(self, n: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while len(self.received) < n and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._t.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Stream:
    """Keeps UDP datagrams flowing to a port (for the tests that need traffic while something happens)."""

    def __init__(self, port: int, size: int = 200, gap: float = 0.002, payload: bytes = b""):
        import threading
        self.port, self.gap = port, gap
        self.payload = payload or b"s" * size
        self._stop = threading.Event()
        self.sent = 0
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not self._stop.is_set():
                s.sendto(self.payload, ("127.0.0.1", self.port))
                self.sent += 1
                self._stop.wait(self.gap)

    def close(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)

    stop = close


def tcp_bulk(addr: str, nbytes: int, seed: int = 1, timeout: float = 20) -> tuple[int, int]:
    """A local server thread reads everything a client sends (nbytes of seeded data) and checks it.
    Returns (server port, client port)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    data = random.Random(seed).randbytes(nbytes)
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, 0))
    srv.listen(1)
    srv.settimeout(timeout)
    port = srv.getsockname()[1]
    got = bytearray()
    errors: list[BaseException] = []

    def serve():
        try:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(timeout)
                while True:
                    chunk = conn.recv(1 << 20)
                    if not chunk:
                        break
                    got.extend(chunk)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with socket.create_connection((addr, port), timeout=timeout) as c:
            cport = c.getsockname()[1]
            c.sendall(data)
            c.shutdown(socket.SHUT_WR)
            t.join(timeout)
    finally:
        srv.close()
    if errors:
        raise errors[0]
    assert bytes(got) == data, f"TCP transfer damaged: {len(got)} of {nbytes} bytes"
    return port, cport


def ping(addr: str, count: int = 3, pattern: str = "", interval: float = 0.2, netns: str | None = None) -> None:
    argv = ["ping", "-n", "-c", str(count), "-i", str(interval), "-W", "2"]
    if pattern:
        argv += ["-p", pattern]
    argv.append(addr)
    if netns:
        argv = ["ip", "netns", "exec", netns] + argv
    r = subprocess.run(argv, capture_output=True, timeout=30)
    assert r.returncode == 0, f"{' '.join(argv)} failed: {r.stdout.decode()} {r.stderr.decode()}"


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


# ---- bpf objects a process holds ----------------------------------------------------------------------

def bpf_ids_of(pid: int) -> dict[str, set[int]]:
    """prog_id / link_id / map_id of every BPF fd process `pid` holds (from /proc/PID/fdinfo)."""
    ids: dict[str, set[int]] = {"prog": set(), "link": set(), "map": set()}
    d = Path(f"/proc/{pid}/fdinfo")
    for fd in d.iterdir():
        try:
            text = fd.read_text()
        except OSError:
            continue
        for key in ("prog", "link", "map"):
            m = re.search(rf"^{key}_id:\s*(\d+)", text, re.M)
            if m:
                ids[key].add(int(m.group(1)))
    return ids


def map_of(pid: int, name: str) -> list:
    """bpftool's dump of the map named `name` that process `pid` holds (JSON)."""
    for i in bpf_ids_of(pid)["map"]:
        shown = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "id", str(i)], capture_output=True,
                                          text=True, timeout=30).stdout or "{}")
        if shown.get("name") == name:
            r = subprocess.run(["bpftool", "-j", "map", "dump", "id", str(i)], capture_output=True, text=True,
                               timeout=30)
            dumped = json.loads(r.stdout)
            assert isinstance(dumped, list), f"bpftool map dump id {i}: {dumped}"
            return dumped
    raise AssertionError(f"fcap (pid {pid}) holds no map {name}")


def pcapng_plan(points: list[str], **config):
    """fcap's own plan for a pcapng capture at `points` (fcap.live.planner.MapPlan: its maps, the file rings)."""
    from fcap.live.session import Config, Session
    s = Session(Config(points=points, **config))
    s.resolve()
    s.write_file("pcapng")
    return s.map_plan()


def send_while_given(fc, port: int, texts: str, value, raw: bool = False) -> tuple[int, int, dict]:
    """A datagram to 127.0.0.1:`port`, the map `texts` of fcap (process fc, -c 42) waited for until user space has
    given the programs a text (at its next pass), 40 datagrams more, and the last, after which fcap ends. Returns the
    programs' count of records through the perf buffer once the text was given and after the 40, and the texts
    given then (given_texts; `raw`: as bytes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"first", ("127.0.0.1", port))
        for _ in range(200):   # (at most POLL_MS, more on a slow guest)
            if map_of(fc.pid, texts):
                break
            time.sleep(0.05)
        first = perf_seen(map_of(fc.pid, "fcap_counters"))
        for i in range(40):
            s.sendto(b"n%02d" % i, ("127.0.0.1", port))
        time.sleep(0.2)   # (the 40 through the kernel)
        counted, given = perf_seen(map_of(fc.pid, "fcap_counters")), given_texts(fc.pid, texts, value, raw)
        s.sendto(b"last", ("127.0.0.1", port))   # (-c 42: fcap ends, its maps with it, after this one)
    return first, counted, given


def given_texts(pid: int, name: str, value, raw: bool = False) -> dict:
    """The texts fcap (process `pid`) gave its programs in its map `name` (bpftool's view): key bytes -> text (`raw`:
    its bytes), each value laid out as `value` (fcap.kernel.layout: len, text)."""
    texts = {}
    for entry in map_of(pid, name):
        data = bytes(int(h, 16) for h in entry["value"])
        at = value.off("text")
        text = data[at:at + value.unpack(data).len]
        texts[bytes(int(h, 16) for h in entry["key"])] = text if raw else text.decode()
    return texts


def perf_seen(counters: list) -> int:
    """The programs' count of records through the perf buffer (seen, a counters value's first u64), all CPUs'."""
    return sum(int.from_bytes(bytes(int(h, 16) for h in v["value"][:8]), "little") for v in counters[0]["values"])


# ---- a veth pair into a network namespace --------------------------------------------------------------

def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


@dataclass
class VethNS:
    """veth `a` (root namespace, `local`) <-> veth `b` (namespace `ns`, `peer`), a /30 of 198.18.0.0/15."""

    ns: str
    a: str
    b: str
    local: str
    peer: str
    a_index: int = 0

    def exec(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]


def make_veth_ns() -> VethNS:
    """Create a namespace and a veth pair with random names and a random /30 of 198.18.0.0/15 (so parallel
    runs do not collide). Undo with remove_veth_ns (also when this raises halfway)."""
    tag = f"{os.getpid() % 100000}{random.randrange(1000):03d}"
    ns, a, b = f"fcapt{tag}", f"fca{tag}", f"fcb{tag}"
    n = random.randrange(1, (1 << 15) // 4 - 1) * 4   # a /30 inside 198.18.0.0/15, never the first
    base = (198 << 24) | (18 << 16) | n
    local = socket.inet_ntoa((base + 1).to_bytes(4, "big"))
    peer = socket.inet_ntoa((base + 2).to_bytes(4, "big"))
    v = VethNS(ns, a, b, local, peer)
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns)
        # no IPv6 on the pair: no router solicitations or DAD in the captures
        sh("sh", "-c", f"echo 1 > /proc/sys/net/ipv6/conf/{a}/disable_ipv6", check=False)
        sh(*v.exec("sh", "-c", f"echo 1 > /proc/sys/net/ipv6/conf/{b}/disable_ipv6"), check=False)
        sh("ip", "addr", "add", f"{local}/30", "dev", a)
        sh("ip", "link", "set", a, "up")
        sh(*v.exec("ip", "addr", "add", f"{peer}/30", "dev", b))
        sh(*v.exec("ip", "link", "set", b, "up"))
        sh(*v.exec("ip", "link", "set", "lo", "up"))
        v.a_index = socket.if_nametoindex(a)
        # resolve the neighbours now (a datagram to the discard port), so ARP is done before any capture
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"arp", (peer, 9))
    except BaseException:
        remove_veth_ns(v)
        raise
    return v


def remove_veth_ns(v: VethNS) -> None:
    sh("ip", "link", "del", v.a, check=False)
    sh("ip", "netns", "del", v.ns, check=False)


PEER_SCRIPT = r"""
import socket, sys, threading, random
addr, nbytes, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, 0))
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((addr, 0)); t.listen(4)
data = random.Random(seed).randbytes(nbytes)
def udp_echo():
    while True:
        d, a = u.recvfrom(65536)
        u.sendto(d, a)
def tcp_send():
    while True:
        c, _ = t.accept()
        with c:
            c.sendall(data)
threading.Thread(target=udp_echo, daemon=True).start()
threading.Thread(target=tcp_send, daemon=True).start()
print(u.getsockname()[1], t.getsockname()[1], flush=True)
sys.stdin.read()   # until the test closes stdin
"""


class Peer:
    """A UDP echo server and a TCP server that sends `nbytes` seeded bytes to each client, inside the netns."""

    def __init__(self, v: VethNS, nbytes: int, seed: int):
        self.nbytes, self.seed = nbytes, seed
        self.proc = subprocess.Popen(v.exec(sys.executable, "-c", PEER_SCRIPT, v.peer, str(nbytes), str(seed)),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline().decode()
        if not line:
            err = self.proc.stderr.read().decode()
            self.close()
            raise AssertionError(f"peer in {v.ns} did not start: {err}")
        self.udp_port, self.tcp_port = map(int, line.split())

    def fetch_tcp(self, addr: str, timeout: float = 20) -> int:
        """Connect, read everything, check it; returns the client's port."""
        with socket.create_connection((addr, self.tcp_port), timeout=timeout) as c:
            port = c.getsockname()[1]
            got = bytearray()
            while len(got) < self.nbytes:
                chunk = c.recv(1 << 20)
                if not chunk:
                    break
                got.extend(chunk)
        assert bytes(got) == random.Random(self.seed).randbytes(self.nbytes), "TCP data from the peer damaged"
        return port

    def udp_echo(self, addr: str, payloads: list[bytes], timeout: float = 5) -> int:
        """Send each payload and wait for its echo; returns the local port."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(timeout)
            s.bind(("0.0.0.0", 0))
            for p in payloads:
                s.sendto(p, (addr, self.udp_port))
                assert s.recv(65536) == p
            return s.getsockname()[1]

    def close(self) -> None:
        stop_helper(self.proc)


def stop_helper(proc: subprocess.Popen) -> None:
    """End a helper process that waits on its stdin: close stdin, wait, kill after 5 s; close its pipes."""
    if proc.poll() is None:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def gso_max_size(dev: str) -> int:
    """The device's gso_max_size (iproute2's detailed link output), 65536 when it does not say."""
    import json
    r = subprocess.run(["ip", "-j", "-d", "link", "show", "dev", dev], capture_output=True, text=True)
    try:
        return int(json.loads(r.stdout)[0].get("gso_max_size", 65536))
    except (ValueError, IndexError, KeyError):
        return 65536


def softnet_drops() -> int:
    """Packets the kernel dropped at its per-CPU input backlogs so far (/proc/net/softnet_stat, 2nd column)."""
    total = 0
    with open("/proc/net/softnet_stat") as f:
        for line in f:
            cols = line.split()
            if len(cols) > 1:
                total += int(cols[1], 16)
    return total
