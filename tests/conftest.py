"""Shared fixtures: root and tool checks, kernel feature probes for fentry/fexit/kprobe, a veth pair into a
network namespace, a UDP sink on 127.0.0.1, an HTTPS server on 127.x."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))          # tests/netns.py
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # the checkout's fcap/ and bpf/


def runtime_dependencies() -> list[str]:
    """pyproject.toml's runtime dependencies (what an install of fcap pulls in)."""
    import tomllib
    with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["dependencies"]


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: loads BPF programs and captures with tcpdump")


def need_tool(name: str, why: str = "") -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed{': ' + why if why else ''}")
    return path


@pytest.fixture
def root():
    need_root()


@pytest.fixture
def tcpdump(root):
    return need_tool("tcpdump", "the captures are compared with tcpdump's")


@pytest.fixture
def tshark():
    return need_tool("tshark", "this check decodes with Wireshark's dissectors")


def kernel_refusal(kind: str, func: str = "ip_output") -> str | None:
    """Why this kernel will not run a `kind` (fentry, fexit, kprobe) program on `func`, or None if it will.
    The probe loads a minimal program of that kind, as fcap itself does."""
    from bpf import probes
    from bpf.btf import BTF
    from bpf.uapi import AttachType

    if kind in ("fentry", "fexit"):
        f = BTF.vmlinux().find(func, "func")
        if f is None:
            return f"{func} is not in this kernel's BTF"
        attach = AttachType.TRACE_FENTRY if kind == "fentry" else AttachType.TRACE_FEXIT
        err = probes.tracing_program(attach, f.id, label=f"{kind} programs")
    elif kind == "kprobe":
        err = probes.kprobe_program()
    else:
        raise ValueError(kind)
    return None if err is None else err.reason


def require_kind(kind: str, func: str = "ip_output") -> None:
    need_root()
    reason = kernel_refusal(kind, func)
    if reason is not None:
        pytest.skip(f"this kernel refuses {kind} programs: {reason}")


@pytest.fixture
def veth_ns(root):
    """A namespace with a veth pair: (root ns) v.a/v.local <-> v.b/v.peer (in v.ns). Removed afterwards,
    also when the test fails."""
    need_tool("ip", "creates the namespace and the veth pair")
    from netns import make_veth_ns, remove_veth_ns
    v = make_veth_ns()
    try:
        yield v
    finally:
        remove_veth_ns(v)


@pytest.fixture
def sink(root):
    """A UDP socket on 127.0.0.1 to send test datagrams to; its port makes the filter `udp port N`."""
    from netns import UDPSink
    s = UDPSink("127.0.0.1")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def https(tmp_path):
    """An HTTPS server on a random 127.x address (a self-signed certificate made by openssl): (address, port)."""
    import http.server
    import random
    import ssl
    import subprocess
    import threading

    from filterutil import random_loopback
    need_tool("openssl")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=fcap-test"], check=True, capture_output=True)
    addr = random_loopback(random.Random())
    srv = http.server.HTTPServer((addr, 0), http.server.SimpleHTTPRequestHandler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield addr, srv.server_address[1]
    srv.shutdown()
    srv.server_close()
