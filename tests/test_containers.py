"""Real containers (podman, rootful; Debian's package: `apt-get install podman`; no image registry: images are made
from local root file systems with `podman import`): a container in a network namespace of the test's own pings the
host through a veth pair beside a process of the same namespace that is no container's; `--context` names the
container (its id, podman's cgroup layout) on its packets and no other's, and `--container NAME` (podman's name for
it) keeps exactly its packets of what tcpdump saw. Then fcap's own image (Containerfile, on a base
deploy/base-image makes with debootstrap) built and run with the host's network and pids: its file, read back, holds
what was sent. Each skips with the reason where this machine cannot run containers."""

from __future__ import annotations

import functools
import io
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
from conftest import need_root, need_tool, runtime_dependencies

from netns import (SLOW, Proc, free_port, make_veth_ns, read_packets, remove_veth_ns, start_fcap, start_tcpdump)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUSYBOX_IMAGE = "localhost/fcap-test-busybox:1"
BASE_IMAGE = "localhost/fcap-base:bookworm"
APPLETS = ("sh", "ping", "sleep", "true", "cat")
# Where the container runtime may not raise rlimits (no CAP_SYS_RESOURCE, as inside another container) podman's
# defaults (nofile 1048576) fail: limits at or below anyone's
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
TIMEOUT = 120 * SLOW


def podman(*args: str, check: bool = True, timeout: float = TIMEOUT, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)}: {r.stderr.strip()}"
    return r


def busybox_image() -> None:
    """An image of one static busybox and its applets (this machine's /bin/busybox), imported once."""
    if podman("image", "exists", BUSYBOX_IMAGE, check=False).returncode == 0:
        return
    exe = shutil.which("busybox")
    if exe is None:
        pytest.skip("no busybox to make the test's container image from (Debian: busybox-static)")
    if subprocess.run(["ldd", exe], capture_output=True, text=True).returncode == 0:
        pytest.skip(f"{exe} is not static: the image holds busybox alone (Debian: busybox-static)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(exe, arcname="bin/busybox")
        for name in APPLETS:
            link = tarfile.TarInfo(f"bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    r = subprocess.run(["podman", "import", "-", BUSYBOX_IMAGE], input=buf.getvalue(), capture_output=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr.decode()


@functools.lru_cache(maxsize=1)
def _runner() -> tuple[tuple, tuple, str]:
    """(podman's global flags, `run` flags) that run a container on this machine, tried in turn: podman's
    defaults; limits it may set (LIMITS); runc instead of crun (crun refuses hybrid cgroup hierarchies whose cgroup2
    part has controllers). Else ((), (), why)."""
    busybox_image()
    tries = [((), ()), ((), LIMITS)]
    if shutil.which("runc"):
        tries.append((("--runtime", "runc"), LIMITS))
    errors = []
    for glob, run in tries:
        r = podman(*glob, "run", "--rm", "--network", "none", *run, BUSYBOX_IMAGE, "true", check=False)
        if r.returncode == 0:
            return glob, run, ""
        errors.append(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"status {r.returncode}")
    return (), (), "; ".join(dict.fromkeys(errors))


@pytest.fixture
def runner(root):
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (Debian: apt-get install podman)")
    glob, run, why = _runner()
    if why:
        pytest.skip(f"podman cannot run a container here: {why}")
    return glob, run


@pytest.fixture
def container(runner):
    """A container of the busybox image, in a veth namespace of the test's own (podman --network ns:PATH):
    (VethNS, id, name, podman's global flags)."""
    glob, run = runner
    v = make_veth_ns()
    name = f"fcapctr{os.getpid() % 100000}{random.randrange(1000):03d}"
    try:
        r = podman(*glob, "run", "-d", "--name", name, "--network", f"ns:/run/netns/{v.ns}", "--cap-add", "NET_RAW",
                   *run, BUSYBOX_IMAGE, "sleep", "600")
        cid = r.stdout.strip().splitlines()[-1]
        assert len(cid) == 64, r.stdout
        yield v, cid, name, glob
    finally:
        podman(*glob, "rm", "-f", "-t", "0", name, check=False)
        remove_veth_ns(v)


ICMP_ECHO = "icmp[icmptype] == icmp-echo"


def _pings(v, name: str, glob: tuple) -> None:
    """3 echo requests of 100 bytes from the container, 2 of 200 from its namespace outside it."""
    podman(*glob, "exec", name, "ping", "-c", "3", "-s", "100", "-W", "1", v.local)
    subprocess.run(["ip", "netns", "exec", v.ns, shutil.which("busybox"), "ping", "-c", "2", "-s", "200", "-W", "1",
                    v.local], check=True, capture_output=True, timeout=TIMEOUT)


def _cgroup_of(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return next(line.split("::", 1)[1].strip() for line in f if line.startswith("0::"))


def test_context_names_a_podman_container_and_container_selects_its_packets(container, tmp_path, tcpdump):
    """The container's pings (its socket in its cgroup, podman's layout for it: /libpod_parent/libpod-ID or
    machine.slice/libpod-ID.scope) carry container=podman:ID and its cgroup path with --context; those of the same
    namespace's other process carry none; --container NAME (podman's name for it) keeps exactly the container's of
    the five tcpdump saw arrive, byte for byte."""
    import fcap
    v, cid, name, glob = container
    pid = int(podman(*glob, "inspect", "-f", "{{.State.Pid}}", name).stdout.strip())
    path = _cgroup_of(pid)
    assert cid in path, path
    ctx, sel, seen = tmp_path / "ctx.pcapng", tmp_path / "sel.pcapng", tmp_path / "t.pcap"
    flt = f"{ICMP_ECHO} and dst host {v.local}"
    td = start_tcpdump(v.a, seen, flt)
    f1 = start_fcap(["-i", "tp_btf/net_dev_queue", "--context", "-c", "5", "-w", str(ctx), flt])
    f2 = start_fcap(["-i", "tp_btf/net_dev_queue", "--container", name, "-c", "3", "-w", str(sel), flt])
    try:
        _pings(v, name, glob)
        assert f1.wait() == 0, f1.stderr
        assert f2.wait() == 0, f2.stderr
    finally:
        for p in (f1, f2):
            p.kill()
        td.stop()
    got = list(fcap.read(str(ctx)))
    assert len(got) == 5
    for p in got:
        ip_len = int.from_bytes(bytes(p.data[16:18]), "big")
        if ip_len == 128:   # 100 bytes of the container's ping
            assert (p.container, p.cgroup_path) == (f"podman:{cid}", path), p.comment
            assert f"container=podman:{cid}" in p.comment
        else:
            assert ip_len == 228 and p.container is None and cid not in (p.cgroup_path or ""), p.comment
    arrived = read_packets(seen)
    assert len(arrived) == 5
    mine = sorted(p.l3 for p in arrived if len(p.l3) == 128)
    assert len(mine) == 3 and sorted(p.l3 for p in read_packets(sel)) == mine


def _context_dir(tmp_path) -> str:
    """The image's build context: what `pip install .` needs (as .containerignore keeps) and wheels/ of fcap's
    dependencies for the base's Python, fetched here by this machine's pip (the build needs no PyPI)."""
    ctx = tmp_path / "context"
    ctx.mkdir()
    for name in ("pyproject.toml", "README.md", "Containerfile"):
        shutil.copy(os.path.join(ROOT, name), ctx / name)
    for name in ("bpf", "fcap", "man"):
        shutil.copytree(os.path.join(ROOT, name), ctx / name, ignore=shutil.ignore_patterns("__pycache__"))
    return str(ctx)


def _wheels(ctx: str, glob: tuple, run: tuple) -> None:
    r = podman(*glob, "run", "--rm", "--network", "none", *run, BASE_IMAGE, "python3", "-c",
               "import sys; print('%d.%d' % sys.version_info[:2])")
    version = r.stdout.strip()
    w = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", os.path.join(ctx, "wheels"),
                        "--only-binary=:all:", "--python-version", version, "--platform", "manylinux_2_28_x86_64",
                        "--platform", "manylinux2014_x86_64", *runtime_dependencies(), "setuptools>=61"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    if w.returncode != 0:
        pytest.skip(f"pip cannot fetch fcap's dependencies for the image: {w.stderr.strip().splitlines()[-1:]}")


@pytest.fixture(scope="module")
def fcap_image(tmp_path_factory):
    """fcap's image: Containerfile built on deploy/base-image's base (made here once when podman has none:
    debootstrap from Debian's mirror), once for the module's tests, removed after them. (its name, (podman's global
    flags, `run` flags), seconds the build took)"""
    need_root()
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (Debian: apt-get install podman)")
    glob, run, why = _runner()
    if why:
        pytest.skip(f"podman cannot run a container here: {why}")
    if podman("image", "exists", BASE_IMAGE, check=False).returncode != 0:
        if shutil.which("debootstrap") is None:
            pytest.skip(f"no {BASE_IMAGE} and no debootstrap to make it (apt-get install debootstrap)")
        r = subprocess.run([os.path.join(ROOT, "deploy", "base-image")], capture_output=True, text=True,
                           timeout=900)
        if r.returncode != 0:
            pytest.skip(f"deploy/base-image could not make the base: {r.stderr.strip().splitlines()[-1:]}")
    ctx = _context_dir(tmp_path_factory.mktemp("image"))
    _wheels(ctx, glob, run)
    image = f"localhost/fcap-test:{os.getpid()}"
    t0 = time.monotonic()
    podman("build", "--network", "host", "--isolation", "chroot", "--build-arg",
           "PIP_ARGS=--no-index --find-links /src/fcap/wheels", "-t", image, ctx, timeout=600)
    yield image, (glob, run), time.monotonic() - t0
    podman("rmi", "-f", image, check=False)


def test_fcaps_image_captures_the_hosts_network(fcap_image, tmp_path):
    """fcap's image run privileged with the host's pids and network, /sys/kernel/btf and bpffs: it captures
    datagrams sent on the host's lo into a file tcpdump's reader (fcap's own here) reads back whole."""
    image, (glob, run), built_s = fcap_image
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    name = f"fcapimg{os.getpid() % 100000}"
    argv = ["podman", *glob, "run", "--rm", "--name", name, "--privileged", "--pid=host", "--net=host", *run,
            "-v", "/sys/kernel/btf:/sys/kernel/btf:ro", "-v", "/sys/fs/bpf:/sys/fs/bpf", "-v", f"{out}:/out", image,
            "-i", "tp_btf/net_dev_queue", "-c", "3", "-w", "/out/c.pcapng", f"udp dst port {port}"]
    fc = Proc(argv, name="fcap in podman")
    try:
        fc.wait_for(r"^listening on ", timeout=TIMEOUT)
        import socket
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(3):
                s.sendto(b"from the host %d" % i, ("127.0.0.1", port))
        assert fc.wait(TIMEOUT) == 0, fc.stderr
    finally:
        fc.kill()
        podman(*glob, "rm", "-f", "-t", "0", name, check=False)
    got = read_packets(out / "c.pcapng")
    assert [p.l3[28:] for p in got] == [b"from the host %d" % i for i in range(3)], f"built in {built_s:.0f} s"
    if shutil.which("tcpdump"):
        r = subprocess.run(["tcpdump", "-nn", "-r", str(out / "c.pcapng")], capture_output=True, text=True)
        assert r.stdout.count(f".{port}: UDP, length 15") == 3, r.stdout + r.stderr


def _pod_of_daemonset(image: str, out, node: str) -> dict:
    """The DaemonSet's pod template as the Pod a node's kubelet runs, for `podman kube play`: the test's image
    (imagePullPolicy Never: no registry here), the files' hostPath a directory of the test's. What podman 4.3 does
    not do as a kubelet does is stood in for: NODE_NAME's fieldRef (spec.nodeName, which it refuses) becomes the
    value `node`, and $(NODE_NAME) in the args (which it leaves as it is) is expanded here."""
    import yaml
    with open(os.path.join(ROOT, "deploy", "daemonset.yaml")) as f:
        template = {d["kind"]: d for d in yaml.safe_load_all(f)}["DaemonSet"]["spec"]["template"]
    spec = template["spec"]
    (c,) = spec["containers"]
    assert c["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    c.update(image=image, imagePullPolicy="Never", env=[{"name": "NODE_NAME", "value": node}],
             args=[a.replace("$(NODE_NAME)", node) for a in c["args"]])
    (vol,) = [v for v in spec["volumes"] if v["name"] == "out"]
    vol["hostPath"]["path"] = str(out)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"fcap-{os.getpid()}",
                                                            "labels": template["metadata"]["labels"]}, "spec": spec}


def _programs_of(pid: int) -> set[int]:
    """The ids of the BPF programs process `pid` holds a descriptor of (the kernel's view: /proc/PID/fdinfo)."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return out
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                out |= {int(line.split()[1]) for line in f if line.startswith("prog_id:")}
        except OSError:
            continue
    return out


def test_the_daemonsets_pod_runs_as_kubernetes_starts_it(fcap_image, tmp_path):
    """deploy/daemonset.yaml's pod template run by a real engine reading Kubernetes YAML (`podman kube play`: the
    node's network and pids, privileged, the hostPath volumes) on the Containerfile's image: fcap listens, drops on
    the node (datagrams to a closed port: NO_SOCKET) land in the rotated file the manifest names
    (/var/lib/fcap/NODE.pcapng0: -C -W) with their context, tcpdump reads it; stopped as a kubelet stops a pod
    (SIGTERM, then the grace period: `podman pod stop`), fcap exits 0 and leaves nothing: its programs and its
    nftables trace table (--nft) are gone."""
    yaml = pytest.importorskip("yaml", reason="PyYAML writes the pod's manifest")
    need_tool("bpftool", "the pod's programs are looked for after it stopped")
    need_tool("nft", "the DaemonSet's fcap runs with --nft")
    image, (glob, _run), _built = fcap_image
    out = tmp_path / "var-lib-fcap"
    pod = _pod_of_daemonset(image, out, "node1")
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    conf = tmp_path / "containers.conf"   # (the limits podman run takes as --ulimit: LIMITS)
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n')
    env = dict(os.environ, CONTAINERS_CONF=str(conf))
    name, ctr = pod["metadata"]["name"], pod["metadata"]["name"] + "-fcap"
    r = podman(*glob, "kube", "play", str(tmp_path / "pod.yaml"), check=False, env=env)
    try:
        if r.returncode != 0 and "catatonit" in r.stderr:
            pytest.skip(f"podman kube play needs catatonit for the pod's infra container (apt-get install "
                        f"catatonit): {r.stderr.strip().splitlines()[-1]}")
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + TIMEOUT
        while "listening on " not in podman("logs", ctr).stderr + podman("logs", ctr).stdout:
            assert time.monotonic() < deadline, podman("logs", ctr).stderr
            time.sleep(0.5)
        pid = int(podman("inspect", "-f", "{{.State.Pid}}", ctr).stdout.strip())
        held = _programs_of(pid)
        port = free_port()
        import socket
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(3):
                s.sendto(b"to a closed port %d" % i, ("127.0.0.1", port))
        time.sleep(1)
        podman("pod", "stop", "-t", "30", name, env=env)
        state = podman("inspect", "-f", "{{.State.ExitCode}}", ctr).stdout.strip()
        logs = podman("logs", ctr)
    finally:
        podman(*glob, "kube", "down", str(tmp_path / "pod.yaml"), check=False, env=env)
    assert state == "0" and " packets captured" in logs.stderr, logs.stderr
    assert held and not held & _loaded(held), "programs left after the pod stopped"
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert f"fcap_nftrace_{pid}" not in tables, tables
    assert sorted(os.listdir(out)) == ["node1.pcapng0"]
    import fcap
    mine = [p for p in fcap.read(str(out / "node1.pcapng0")) if b"to a closed port" in bytes(p.data)]
    assert len(mine) == 3 and {p.reason for p in mine} == {"NO_SOCKET"}, [p.comment for p in mine]
    assert all(p.cgroup is not None and p.point == "skb:drop" for p in mine), [p.comment for p in mine]
    r = subprocess.run(["tcpdump", "-nn", "-r", str(out / "node1.pcapng0"), f"udp dst port {port}"],
                       capture_output=True, text=True)
    assert r.stdout.count(f".{port}: UDP, length 18") == 3, r.stdout + r.stderr


def _loaded(ids: set[int]) -> set[int]:
    """Those of these program ids that are still loaded."""
    return {i for i in ids if subprocess.run(["bpftool", "prog", "show", "id", str(i)], capture_output=True,
                                             timeout=30).returncode == 0}


def test_runtime_names_from_podmans_and_dockers_records(tmp_path, monkeypatch):
    """--container NAME: the ids podman's containers.json and docker's config.v2.json give NAME (their layouts)."""
    import json

    from fcap.host import ctxnames
    a, b, c = ("a" * 64, "b" * 64, "c" * 64)
    (tmp_path / "containers.json").write_text(json.dumps([{"id": a, "names": ["web"]}, {"id": b, "names": ["db"]}]))
    (tmp_path / "docker" / c).mkdir(parents=True)
    (tmp_path / "docker" / c / "config.v2.json").write_text(json.dumps({"ID": c, "Name": "/web"}))
    monkeypatch.setattr(ctxnames, "PODMAN_CONTAINERS", str(tmp_path / "containers.json"))
    monkeypatch.setattr(ctxnames, "DOCKER_CONTAINERS", str(tmp_path / "docker"))
    assert ctxnames.runtime_ids("web") == [a, c] and ctxnames.runtime_ids("db") == [b]
    assert ctxnames.runtime_ids("nothing") == []


def test_the_manifests_are_valid_kubernetes_objects():
    """Each object of deploy/daemonset.yaml validated against the Kubernetes API's own OpenAPI schema (the newest
    kubernetes-validate carries, strict: an unknown field is an error, as `kubectl apply` on a cluster says), with
    no cluster; a misspelt field is caught the same way."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate carries the API's schemas")
    import yaml
    from kubernetes_validate.utils import latest_version
    with open(os.path.join(ROOT, "deploy", "daemonset.yaml")) as f:
        docs = list(yaml.safe_load_all(f))
    assert [d["kind"] for d in docs] == ["Namespace", "DaemonSet"]
    for d in docs:
        kv.validate(d, latest_version(), strict=True)
    docs[1]["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kv.ValidationError, match="hostNetwrok"):
        kv.validate(docs[1], latest_version(), strict=True)


def test_the_daemonsets_arguments_are_fcaps():
    """deploy/daemonset.yaml (not run here: no Kubernetes): a DaemonSet whose pods have the node's network and pids,
    privileged, BTF and bpffs mounted, a volume for the files, and arguments fcap's own parser takes."""
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifest")
    from fcap.commands.cli import _parser
    with open(os.path.join(ROOT, "deploy", "daemonset.yaml")) as f:
        docs = {d["kind"]: d for d in yaml.safe_load_all(f)}
    ds = docs["DaemonSet"]
    template = ds["spec"]["template"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    spec = template["spec"]
    assert spec["hostNetwork"] is True and spec["hostPID"] is True
    (c,) = spec["containers"]
    assert c["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert {"/sys/kernel/btf", "/sys/fs/bpf", "/var/lib/fcap"} <= set(mounts)
    assert set(mounts.values()) <= {v["name"] for v in spec["volumes"]}
    args = _parser().parse_args([a.replace("$(NODE_NAME)", "node1") for a in c["args"]])
    assert args.write == "/var/lib/fcap/node1.pcapng" and args.points == ["skb:drop"] and args.nft
    assert any(e["name"] == "NODE_NAME" for e in c["env"])
