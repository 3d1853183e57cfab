"""python -m bench.mirror: what a libpcap program sees of fcap's --mirror under a flood. One sender (bench/sender.c,
64-byte UDP on 127.0.0.1, full speed or --rate) while `fcap -i tp_btf/net_dev_queue --mirror NAME` captures it and
`tcpdump -i NAME -w FILE` reads the mirror; counted exactly: fcap's "captured" line against the distinct sequence
numbers in tcpdump's file (and the device's tx_dropped)."""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .traffic import Sender, pinned

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MAGIC = b"fcapbnch"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(proc: subprocess.Popen, pattern: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"bench.mirror: {proc.args[0]} exited before {pattern!r}")
        if re.search(pattern, line):
            return
    raise SystemExit(f"bench.mirror: no {pattern!r}")


def _seqs(path: str) -> int:
    data = open(path, "rb").read()
    seqs, at = set(), data.find(MAGIC)
    while at >= 0:
        seqs.add(data[at + 8:at + 16])
        at = data.find(MAGIC, at + 16)
    return len(seqs)


def run(count: int, rate: int) -> dict:
    sender = Sender()
    name = f"fcmb{random.randrange(10000)}"
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="fcap-mirror-")
    out = os.path.join(tmp, "mirror.pcap")
    env = dict(os.environ, PYTHONPATH=ROOT)
    fcap = subprocess.Popen(pinned(1, [sys.executable, "-m", "fcap.commands.cli", "-i", "tp_btf/net_dev_queue",
                                       "--mirror", name, f"udp and dst port {port}"]),
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        _wait_for(fcap, r"^listening on")
        td = subprocess.Popen(pinned(1, ["tcpdump", "-i", name, "-w", out, "-B", "16384", "--immediate-mode",
                                         "-s", "128", "udp"]), stderr=subprocess.PIPE, text=True)
        _wait_for(td, r"listening on")
        argv = pinned(0, [sender.path, "64", str(count), str(rate), "32", "0", str(port)])
        sent = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
        time.sleep(1.0)
        dropped = int(open(f"/sys/class/net/{name}/statistics/tx_dropped").read())
        td.send_signal(signal.SIGINT)
        td.wait(30)
        fcap.send_signal(signal.SIGINT)
        err = fcap.communicate(timeout=30)[1]
    finally:
        for p in (fcap,):
            if p.poll() is None:
                p.kill()
        sender.close()
    captured = int(re.search(r"(\d+) packets? captured", err).group(1))
    seen = _seqs(out)
    os.unlink(out)
    os.rmdir(tmp)
    return {"sent": int(sent[1]), "fcap captured": captured, "tcpdump -i mirror": seen,
            "share of fcap's": seen / captured if captured else 0.0, "device tx_dropped": dropped}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.mirror", description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=300_000)
    ap.add_argument("--rate", type=int, default=0, help="datagrams per second (0: full speed)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    for _ in range(a.rounds):
        print(run(a.count, a.rate), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
