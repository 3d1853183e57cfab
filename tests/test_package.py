"""What a release to the package index would ship: a wheel and an sdist built by the standard tool (`python -m
build`, which builds the wheel from the sdist) each install into a fresh venv whose `fcap` command captures a file
tcpdump reads; the wheel carries the man page and the data files pyproject.toml declares, the sdist the sources."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
from conftest import need_root, need_tool, runtime_dependencies

ROOT = Path(__file__).resolve().parent.parent
# the environment of a command that must see only what is installed (conftest puts the checkout on PYTHONPATH)
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _declared() -> tuple[list[str], list[str]]:
    """pyproject.toml's packages, and the files it installs beside them: (package-data as paths in the wheel,
    data-files as paths under the install prefix)."""
    tomllib = pytest.importorskip("tomllib")
    st = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = [f"{pkg.replace('.', '/')}/{name}" for pkg, names in st.get("package-data", {}).items()
            for name in names]
    files = [f"{prefix}/{Path(name).name}" for prefix, names in st.get("data-files", {}).items() for name in names]
    return st["packages"], data + ["|" + f for f in files]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """sdist and wheel of the tracked files (a fresh clone's), built once for the module."""
    pytest.importorskip("build", reason="python -m build: pip install build (the test extra has it)")
    top = tmp_path_factory.mktemp("pkg")
    src = top / "src"
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((ROOT / rel).read_bytes())
    r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(top / "dist"), str(src)],
                       capture_output=True, text=True, timeout=600, env=CLEAN_ENV)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"wheel": next((top / "dist").glob("fcap-*.whl")), "sdist": next((top / "dist").glob("fcap-*.tar.gz")),
            "top": top}


def _venv(dist, artifact: Path) -> Path:
    """A fresh venv with artifact installed (without its dependencies), then the runtime dependencies."""
    venv = dist["top"] / ("venv-" + artifact.name.split(".")[-1])
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=CLEAN_ENV)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for args in (["--no-deps", str(artifact)], runtime_dependencies()):
        r = subprocess.run(pip + args, capture_output=True, text=True, timeout=600, env=CLEAN_ENV)
        assert r.returncode == 0, r.stderr[-3000:]
    return venv


def test_the_wheel_carries_the_packages_man_page_and_data_files(dist):
    packages, data = _declared()
    with zipfile.ZipFile(dist["wheel"]) as z:
        names = z.namelist()
    for pkg in packages:
        assert f"{pkg.replace('.', '/')}/__init__.py" in names, pkg
    for path in data:
        if path.startswith("|"):   # a data file: under <name>-<version>.data/data/
            assert any(n.endswith(".data/data/" + path[1:]) for n in names), (path, names)
        else:
            assert path in names, path
    assert any(n.endswith(".data/data/share/man/man1/fcap.1") for n in names)
    assert not any(n.startswith("tests/") for n in names)


def test_the_sdist_holds_what_the_wheel_is_built_from(dist):
    with tarfile.open(dist["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "bpf", "fcap", "man/fcap.1"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert tracked and not set(tracked) - names, sorted(set(tracked) - names)
    assert {"pyproject.toml", "README.md"} <= names


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_fcap_captures(dist, kind, tmp_path):
    need_root()
    tcpdump = need_tool("tcpdump")
    venv = _venv(dist, dist[kind])
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import fcap; print(fcap.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, env=CLEAN_ENV).stdout
    assert where.startswith(str(venv)), where
    assert (venv / "share" / "man" / "man1" / "fcap.1").is_file()
    out = tmp_path / "installed.pcapng"

    def traffic():
        time.sleep(1.5)
        import socket
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(5):
                s.sendto(b"from the installed fcap", ("127.0.0.1", 9))
                time.sleep(0.05)
    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    r = subprocess.run([str(venv / "bin" / "fcap"), "-i", "tp_btf/net_dev_queue", "-c", "2", "-w", str(out),
                        "udp and dst host 127.0.0.1 and dst port 9"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60, env=CLEAN_ENV)
    t.join()
    assert r.returncode == 0 and "2 packets captured" in r.stderr, r.stderr[-2000:]
    read = subprocess.run([tcpdump, "-nn", "-r", str(out)], capture_output=True, text=True, timeout=30)
    lines = read.stdout.splitlines()
    assert read.returncode == 0 and len(lines) == 2 and all("127.0.0.1.9:" in ln for ln in lines), read.stdout
