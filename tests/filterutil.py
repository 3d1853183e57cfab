"""Helpers for the in-kernel filter and predicate tests: several fcap captures running at once over the same
traffic, a traffic mix on lo that can be told apart from whatever else lo carries, sender processes with a pid,
comm or mark of their own, the per-packet comments fcap writes in pcapng, and multiset comparisons.

Traffic goes only to 127.0.0.0/8 and ::1 here (the veth tests use tests/netns.py's namespace)."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from netns import Pkt, Proc, UDPSink, fcap_argv, flow_of, ping, read_packets, stop_helper

IN_VM = bool(os.environ.get("FCAP_VM"))
# many fcap processes start at once, their programs verified side by side: the time until the last is listening
# grows with how many (~3 s each in a TCG guest, alone; 24 at once in a busy 7.2 guest took over 180 s)
READY = 180.0 if IN_VM else 60.0
READY_EACH = 20.0 if IN_VM else 5.0
SETTLE = 0.3                         # after the last packet, before stopping the captures
POINT = "tp_btf/net_dev_queue"


# ---- several captures over the same traffic --------------------------------------------------------------

@dataclass
class Capture:
    name: str
    args: list[str]
    path: Path
    proc: Proc | None = None
    status: int | None = None

    @property
    def stderr(self) -> str:
        return self.proc.stderr if self.proc else ""

    def dropped(self) -> int | None:
        m = re.search(r"^(\d+) packets? dropped by kernel", self.stderr, re.M)
        return int(m.group(1)) if m else None


class Captures:
    """Start every capture, wait until each one says it is listening, run the traffic, stop them all (SIGINT),
    and check each one exited 0 and lost nothing.

        with Captures(tmp, {"all": [], "udp": ["udp"]}) as caps:
            traffic()
        caps["udp"].path
    """

    def __init__(self, directory: Path, specs: dict[str, list[str]], point: str = POINT, ext: str = "pcapng"):
        self.caps: dict[str, Capture] = {}
        for i, (name, args) in enumerate(specs.items()):
            path = Path(directory) / f"cap{i:02d}.{ext}"
            if "-i" not in args:
                args = ["-i", point, *args]
            self.caps[name] = Capture(name, ["-w", str(path), *args], path)

    def __getitem__(self, name: str) -> Capture:
        return self.caps[name]

    def __enter__(self) -> Captures:
        try:
            for c in self.caps.values():
                c.proc = Proc(fcap_argv() + c.args, name=f"fcap [{c.name}]")
            ready = max(READY, READY_EACH * len(self.caps))
            for c in self.caps.values():
                c.proc.wait_for(r"^listening on ", timeout=ready)
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.kill()
            return
        time.sleep(SETTLE)
        try:
            for c in self.caps.values():
                if c.proc.p.poll() is None:
                    c.proc.p.send_signal(signal.SIGINT)
            for c in self.caps.values():
                c.status = c.proc.wait()
        finally:
            self.kill()
        for c in self.caps.values():
            assert c.status == 0, f"fcap [{c.name}] exited with {c.status}: {c.stderr}"
            assert "Traceback" not in c.stderr, f"fcap [{c.name}]: {c.stderr}"
            assert c.dropped() == 0, f"fcap [{c.name}] lost packets, the comparison would mean nothing: {c.stderr}"

    def kill(self) -> None:
        for c in self.caps.values():
            if c.proc is not None:
                c.proc.kill()


# ---- what fcap writes as each packet's comment (pcapng) -------------------------------------------------

_FIELD = re.compile(r"(\w+)=(\S*)")
_INTS = ("pid", "tid", "ifindex", "netns", "pkt_type", "len")


def meta(p: Pkt) -> dict:
    """The packet comment fcap writes, `skb=0x.. pid=.. tid=.. comm=.. ifindex=.. mark=0x.. netns=.. proto=0x..
    pkt_type=.. len=..`, as a dict (numbers as ints)."""
    assert p.comment, "the packet has no comment: was it written as pcapng by fcap?"
    d: dict = dict(_FIELD.findall(p.comment))
    for k in _INTS:
        d[k] = int(d[k])
    for k in ("skb", "mark", "proto"):
        d[k] = int(d[k], 16)
    return d


# ---- comparisons ----------------------------------------------------------------------------------------

def key(p: Pkt) -> tuple[bytes, int]:
    return p.raw, p.orig_l3_len


def describe(p: Pkt) -> str:
    f = flow_of(p)
    if f is None:
        return f"{len(p.raw)}/{p.orig_l3_len}-byte non-IP packet"
    return f"proto {f.proto} {f.src}:{f.sport} > {f.dst}:{f.dport} ({len(p.raw)} bytes captured, l3 {p.orig_l3_len})"


def multiset_diff(got: list[Pkt], want: list[Pkt], what: str) -> str | None:
    """None when `got` and `want` hold the same packets (bytes and lengths, any order); else what differs."""
    g, w = Counter(map(key, got)), Counter(map(key, want))
    if g == w:
        return None
    by_key = {key(p): p for p in got + want}
    extra = [by_key[k] for k in (g - w).elements()]
    missing = [by_key[k] for k in (w - g).elements()]
    lines = [f"{what}: fcap kept {len(got)} packets, the reference {len(want)}; "
             f"{len(extra)} only in fcap's, {len(missing)} only in the reference's"]
    lines += [f"  only fcap:      {describe(p)}" for p in extra[:5]]
    lines += [f"  only reference: {describe(p)}" for p in missing[:5]]
    return "\n".join(lines)


def tcpdump_filter(src: Path, expr: str, dst: Path) -> list[Pkt]:
    """tcpdump -r SRC -w DST EXPR: the packets libpcap (tcpdump's own copy) keeps."""
    r = subprocess.run(["tcpdump", "-r", str(src), "-w", str(dst), expr], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"tcpdump -r {src.name} {expr!r}: {r.stderr.strip()}"
    return read_packets(dst)


# ---- a namespace of the test's own ---------------------------------------------------------------------

class NetNS:
    """A network namespace with lo up, for traffic nothing else on the machine makes: captures given
    `--netns INUM` see only it (a benchmark flooding the host's lo would otherwise fill their buffers)."""

    def __init__(self, prefix: str = "fcapf"):
        self.name = f"{prefix}{os.getpid() % 100000}{random.randrange(1000):03d}"
        _ip("netns", "add", self.name)
        try:
            _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
            self.inum = os.stat(f"/run/netns/{self.name}").st_ino
        except BaseException:
            self.close()
            raise

    def exec(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)

    def __enter__(self) -> NetNS:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ip(*argv: str) -> None:
    r = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError(f"ip {' '.join(argv)}: {r.stderr.strip()}")


# ---- a traffic mix on lo ----------------------------------------------------------------------------------

def random_loopback(rnd: random.Random, avoid: set[str] = frozenset()) -> str:
    """A random 127.x.y.z (x >= 100), so this test's packets can be told from other traffic on lo."""
    while True:
        a = f"127.{rnd.randrange(100, 255)}.{rnd.randrange(256)}.{rnd.randrange(1, 255)}"
        if a not in avoid:
            return a


GET = b"GET "


def _payload(rnd: random.Random, size: int, get: bool) -> bytes:
    body = rnd.randbytes(size)
    if get:
        body = (GET + b"/ HTTP/1.0\r\n" + body)[:size]
    elif body[:4] == GET:
        body = b"x" + body[1:]
    return body


def serve_tcp(addr: str, port: int, reply: bytes, timeout: float = 20) -> tuple[socket.socket, threading.Thread,
                                                                                    list]:
    """A server on (addr, port) that reads one request (until the client shuts its side) and sends `reply`."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(2)
    srv.settimeout(timeout)
    got: list = []

    def run():
        try:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(timeout)
                data = bytearray()
                while chunk := conn.recv(65536):
                    data += chunk
                got.append(bytes(data))
                conn.sendall(reply)
        except BaseException as e:  # noqa: BLE001 - reported by the client side
            got.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv, t, got


def tcp_exchange(server: str, port: int, request: bytes, reply: bytes, client: str | None = None,
                 timeout: float = 20) -> tuple[int, int]:
    """Client (bound to `client`) sends `request`, shuts down its side, reads `reply` to the end.
    Returns (server port, client port)."""
    srv, t, got = serve_tcp(server, port, reply, timeout)
    sport = srv.getsockname()[1]
    family = srv.family
    try:
        with socket.socket(family, socket.SOCK_STREAM) as c:
            c.settimeout(timeout)
            if client:
                c.bind((client, 0))
            c.connect((server, sport))
            cport = c.getsockname()[1]
            c.sendall(request)
            c.shutdown(socket.SHUT_WR)
            data = bytearray()
            while chunk := c.recv(1 << 20):
                data += chunk
        t.join(timeout)
    finally:
        srv.close()
    assert got and not isinstance(got[0], BaseException), f"TCP server on {server}: {got}"
    assert got[0] == request, "TCP request damaged"
    assert bytes(data) == reply, f"TCP reply damaged: {len(data)} of {len(reply)} bytes"
    return sport, cport


@dataclass
class Mix:
    """What identifies the mix's packets: its two random loopback addresses (IPv4), the ports of its IPv6
    sockets, the tag in its ICMPv6 echoes."""

    a: str                 # every IPv4 packet of the mix has a or b as its source or destination
    b: str
    tag: bytes
    v6: bool
    pinged: bool
    v6_ports: set[int] = field(default_factory=set)
    sent: dict = field(default_factory=dict)

    def ours(self, p: Pkt) -> bool:
        f = flow_of(p)
        if f is None:
            return False
        if ":" not in f.src:
            return bool({f.src, f.dst} & {self.a, self.b})
        if f.proto in (6, 17):
            return bool({f.sport, f.dport} & self.v6_ports)
        return f.proto == 58 and self.tag in p.l3


UDP_PLAN = [  # (source, source port, destination port, [(size, starts with "GET ")])
    ("b", 0, 2222, [(16, False), (90, True), (300, False), (1000, False), (1400, True), (2500, False),
                    (4500, True), (9000, False)]),
    ("127.0.0.1", 0, 2500, [(40, False), (1200, True), (5000, False)]),
    ("b", 2222, 3333, [(50, False), (3000, False)]),
    ("b", 0, 3333, [(20, True), (700, False), (6000, False)]),
]
UDP6_PLAN = [(30, False), (1300, True), (4100, False), (8000, True)]
TCP_BIG = 200_000


def run_mix(seed: int, v6: bool, ping_ok: bool) -> Mix:
    """UDP over IPv4 and IPv6 on several ports and sizes (> 4 KB too), some payloads starting with "GET ";
    a TCP exchange over IPv4 whose request starts with "GET " and whose 200 KB reply travels in page frags
    (byte i of the reply is i % 251, so a byte deep in a packet can be checked against its first payload
    byte); a TCP exchange over IPv6; ICMP echo (ping) over IPv4 and IPv6."""
    rnd = random.Random(seed)
    a = random_loopback(rnd)
    b = random_loopback(rnd, {a})
    mix = Mix(a, b, rnd.randbytes(8), v6, ping_ok)
    sinks = {port: UDPSink(a, port) for port in sorted({p for _, _, p, _ in UDP_PLAN})}
    sink6 = UDPSink("::1") if v6 else None
    n_udp = 0
    try:
        for src, sport, dport, sizes in UDP_PLAN:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((b if src == "b" else src, sport))
                for size, get in sizes:
                    s.sendto(_payload(rnd, size, get), (a, dport))
                    n_udp += 1
        if sink6 is not None:
            mix.v6_ports.add(sink6.port)
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                s.bind(("::1", 0))
                mix.v6_ports.add(s.getsockname()[1])
                for size, get in UDP6_PLAN:
                    s.sendto(_payload(rnd, size, get), ("::1", sink6.port))
        for port, sink in sinks.items():
            want = sum(len(sz) for _, _, p, sz in UDP_PLAN if p == port)
            sink.wait(want)
            assert len(sink.received) == want, f"UDP to {a}:{port}: {len(sink.received)} of {want} arrived"
        if sink6 is not None:
            sink6.wait(len(UDP6_PLAN))
            assert len(sink6.received) == len(UDP6_PLAN), "UDP to ::1 lost datagrams"
    finally:
        for sink in [*sinks.values(), sink6]:
            if sink is not None:
                sink.close()
    big = bytes(i % 251 for i in range(TCP_BIG))
    tcp_exchange(a, 2600, GET + b"/big HTTP/1.0\r\n\r\n", big, client=b)
    if v6:
        mix.v6_ports |= set(tcp_exchange("::1", 0, GET + b"/v6 HTTP/1.0\r\n\r\n", rnd.randbytes(20_000)))
    if ping_ok:
        ping(a, count=3, pattern=mix.tag.hex(), interval=0.05)
        subprocess.run(["ping", "-n", "-q", "-c", "1", "-s", "1500", "-W", "2", "-p", mix.tag.hex(), a],
                       capture_output=True, timeout=30, check=True)
        if v6:
            ping("::1", count=2, pattern=mix.tag.hex(), interval=0.05)
    mix.sent = {"udp4": n_udp}
    return mix


MIX_SCRIPT = r"""
import json, sys
sys.path[:0] = [sys.argv[1]]
import shutil
from filterutil import run_mix
from netns import ipv6_loopback
m = run_mix(int(sys.argv[2]), ipv6_loopback(), shutil.which("ping") is not None)
print(json.dumps({"a": m.a, "b": m.b, "tag": m.tag.hex(), "v6": m.v6, "pinged": m.pinged,
                  "v6_ports": sorted(m.v6_ports), "sent": m.sent}))
"""


def run_mix_in(ns: NetNS, seed: int) -> Mix:
    """run_mix inside the namespace (a child process there); the Mix it made."""
    import json

    from netns import subprocess_env
    r = subprocess.run(ns.exec(sys.executable, "-c", MIX_SCRIPT, str(Path(__file__).resolve().parent), str(seed)),
                       capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert r.returncode == 0, f"the traffic mix failed in {ns.name}:\n{r.stderr}"
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return Mix(d["a"], d["b"], bytes.fromhex(d["tag"]), d["v6"], d["pinged"], set(d["v6_ports"]), d["sent"])


# ---- sender processes with a pid, a comm and a mark of their own ----------------------------------------

SENDER = r"""
import ctypes, socket, sys
dst, port, count, size, tag, comm, mark = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    bytes.fromhex(sys.argv[5]), sys.argv[6], int(sys.argv[7])
if comm:
    assert ctypes.CDLL(None).prctl(15, comm.encode(), 0, 0, 0) == 0     # PR_SET_NAME
v6 = ":" in dst
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
if mark:
    s.setsockopt(socket.SOL_SOCKET, 36, mark)                            # SO_MARK
s.bind(("::1" if v6 else "127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
sys.stdin.readline()
for i in range(count):
    s.sendto((tag + i.to_bytes(4, "big") + bytes(size))[:max(size, 12)], (dst, port))
print("sent", flush=True)
sys.stdin.readline()
"""


class Sender:
    """A process that sends `count` UDP datagrams carrying `tag` to (dst, port) when told to, from a socket
    bound to 127.0.0.1 (::1 when dst is IPv6) with SO_MARK `mark` (0: none), with its comm set to `comm` ('':
    unchanged), in namespace `ns` (None: this one). Its pid is the Python process's (ip netns exec execs)."""

    def __init__(self, dst: str, port: int, count: int = 5, size: int = 64, comm: str = "", mark: int = 0,
                 ns: NetNS | None = None):
        self.tag = os.urandom(8)
        self.count = count
        argv = [sys.executable, "-c", SENDER, dst, str(port), str(count), str(size), self.tag.hex(), comm,
                str(mark)]
        self.proc = subprocess.Popen(ns.exec(*argv) if ns else argv,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"sender did not start: {self.proc.stderr.read().decode()}")
        self.port = int(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self) -> None:
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line == b"sent\n", f"sender failed: {line!r} {self.proc.stderr.read().decode()}"

    def mine(self, p: Pkt) -> bool:
        f = flow_of(p)
        return f is not None and f.proto == 17 and f.sport == self.port and self.tag in p.l3

    def close(self) -> None:
        stop_helper(self.proc)


def send_udp_from(src: str, dst: str, port: int, payloads: list[bytes], mark: int = 0, family=socket.AF_INET,
                  broadcast: bool = False) -> int:
    """Send each payload from a socket bound to (src, 0) with SO_MARK `mark`; returns the source port."""
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        if mark:
            s.setsockopt(socket.SOL_SOCKET, 36, mark)
        if broadcast:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        s.bind((src, 0))
        for p in payloads:
            s.sendto(p, (dst, port))
        return s.getsockname()[1]
