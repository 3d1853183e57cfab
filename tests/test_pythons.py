"""fcap on the oldest and the newest Python it supports (pyproject.toml's requires-python: 3.9, as Debian 11 and
RHEL 9 ship; 3.13, as Debian 13): every module imports, and a live capture without a filter (which needs no
package but fcap's own) writes a file tcpdump reads. Interpreters come from pyenv or PATH; a missing one skips."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import need_root, need_tool

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("3.9", "3.13")
# modules that import a package beside fcap's own (the rest import with none): the package each needs
NEEDS = {"fcap.live.fastmerge": "numpy", "fcap.live.perfwalk": "numpy", "fcap.files.iovec": "numpy",
         "fcap.files.batches": "numpy", "fcap.text.fastlines": "numpy", "fcap.text.fastjson": "numpy",
         "fcap.text.fastverbose": "numpy", "fcap.text.fastfile": "numpy", "fcap.text.headcols": "numpy",
         "fcap.text.fastflows": "numpy",
         "fcap.pcapy_compat": "pcapy", "fcap.scapysock": "scapy"}


def _python(version: str) -> str | None:
    """pyenv's interpreter of that version, else python3.X on PATH (one that runs: pyenv's shims may not)."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}")) + [shutil.which(f"python{version}")]
    for exe in filter(None, found):
        if subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=30).returncode == 0:
            return exe
    return None


def _need(version: str) -> str:
    exe = _python(version)
    if exe is None:
        pytest.skip(f"no Python {version} on this machine (pyenv or python{version} on PATH)")
    return exe


def _modules() -> list[str]:
    names = []
    for pkg in ("bpf", "fcap"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "__main__.py":   # (runs the command)
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            names.append(".".join(p for p in rel.parts if p != "__init__") or pkg)
    return names


@pytest.mark.parametrize("version", VERSIONS)
def test_every_module_imports(version):
    exe = _need(version)
    # (NEEDS' modules import their package where this interpreter has it)
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
            "    except ModuleNotFoundError as e:\n        if %r.get(m) != e.name:\n            raise\n"
            % (NEEDS,))
    r = subprocess.run([exe, "-c", code, *_modules()], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_live_capture(version, tmp_path):
    need_root()
    tcpdump = need_tool("tcpdump")
    exe = _need(version)
    out = tmp_path / "py.pcapng"

    def traffic():
        time.sleep(1.0)
        import socket
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(5):
                s.sendto(b"which python", ("127.0.0.1", 9))
                time.sleep(0.05)
    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    r = subprocess.run([exe, "-m", "fcap.commands.cli", "-i", "tp_btf/net_dev_queue", "-c", "2", "-w", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    t.join()
    assert r.returncode == 0 and "2 packets captured" in r.stderr, r.stderr[-2000:]
    read = subprocess.run([tcpdump, "-nn", "-r", str(out)], capture_output=True, text=True, timeout=30)
    assert read.returncode == 0 and len(read.stdout.splitlines()) == 2, read.stderr
    assert sys.version_info >= (3, 9)


def test_pyproject_says_what_is_tested():
    """requires-python's floor is the oldest Python tested here, and the classifiers name the Pythons tested: these
    and the one the suite runs on."""
    import re
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^requires-python = ">=(\S+)"$', text, re.M).group(1) == VERSIONS[0]
    said = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', text))
    assert said >= set(VERSIONS) | {f"{sys.version_info[0]}.{sys.version_info[1]}"}, said
