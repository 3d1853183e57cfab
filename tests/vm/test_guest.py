"""The VM tier's premise, checked inside tests/vm/run guests (skipped anywhere else)."""

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(not os.environ.get("FCAP_VM"), reason="runs only inside tests/vm/run guests (FCAP_VM unset)"),
]
HERE = Path(__file__).resolve().parent


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=60)


def test_kernel_is_the_one_asked_for():
    name = os.environ["FCAP_VM"]
    if name[:1].isdigit():   # "6.1"; "newest" and "experimental" are whatever Debian's suite ships (a release
        # such as experimental's "7.3-cloud-amd64" need not have a third number)
        assert os.uname().release.startswith(name + ".")
    assert os.environ["FCAP_VM_KERNEL"] == os.uname().release
    assert os.path.exists("/sys/kernel/btf/vmlinux")


# ELF e_machine of the guest's own programs, by the kernel's machine
EM = {"x86_64": 62, "aarch64": 183}


def test_every_program_is_the_kernels_architecture():
    """The arm64 guest is arm64 throughout (its Python, pcapy-ng, the tools, busybox), as the x86 ones are x86-64:
    none of this machine's files where the kernel's architecture differs."""
    machine = os.uname().machine
    assert machine == ("aarch64" if os.environ["FCAP_VM"] == "arm64" else "x86_64")
    import pcapy
    progs = [sys.executable, pcapy.__file__] + [shutil.which(t) for t in ("tcpdump", "ip", "bpftool", "busybox")]
    for p in progs:
        with open(os.path.realpath(p), "rb") as f:
            head = f.read(20)
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == EM[machine], p


def test_fentry_fexit_kprobe_load_attach_and_fire():
    r = subprocess.run([sys.executable, str(HERE / "probe_fentry.py"), "ip_output"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for kind in ("fentry", "fexit", "kprobe"):
        assert re.search(r"^%s\s+ip_output: loaded, attached, fired [1-9]" % kind, r.stdout, re.M), r.stdout


def test_veth_pair_between_namespaces():
    ns = "fcapvm" + uuid.uuid4().hex[:6]
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", "name", ns + "a", "type", "veth", "peer", "name", ns + "b", "netns", ns)
        sh("ip", "addr", "add", "198.18.0.1/24", "dev", ns + "a")
        sh("ip", "link", "set", ns + "a", "up")
        sh("ip", "-n", ns, "addr", "add", "198.18.0.2/24", "dev", ns + "b")
        sh("ip", "-n", ns, "link", "set", ns + "b", "up")
        sh("ping", "-c", "1", "-W", "5", "198.18.0.2")
    finally:
        sh("ip", "link", "del", ns + "a", check=False)
        sh("ip", "netns", "del", ns, check=False)


def test_tools_and_checkout():
    for tool in ("tcpdump", "ip", "tc", "bpftool", "fcap", "python3", "pytest"):
        assert shutil.which(tool), tool
    assert "tcpdump version" in sh("tcpdump", "--version").stdout
    assert Path(os.environ["FCAP_VM_ROOT"], "pyproject.toml").exists()
    assert os.getcwd() == os.environ["FCAP_VM_ROOT"]
    assert os.path.isdir(os.environ["FCAP_VM_OUT"])


def test_python_is_the_one_the_runner_chose():
    """The guest's Python (the suite's own, tests/vm/run's KERNELS) runs its subprocesses too: sys.executable, and
    python3 on PATH (as the fcap wrapper runs it), are the same version, with pcapy-ng's libpcap working."""
    want = os.environ["FCAP_VM_PYTHON_VERSION"]
    assert sys.version.split()[0] == want
    code = "import sys, pcapy; pcapy.compile(1, 96, 'udp', 1, 0); print(sys.version.split()[0])"
    for exe in (sys.executable, shutil.which("python3")):
        assert sh(exe, "-c", code).stdout.strip() == want, exe
