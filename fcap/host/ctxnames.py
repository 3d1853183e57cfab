"""Names for the context --context records (user space): a cgroup id's path in the cgroup2 hierarchy (the id is its
directory's inode number: the tree walked once, cached, walked again on a miss), the container and pod the path
names (fcap.host.containers), a network namespace inode's name (`ip netns` bind mounts in /run/netns, docker's in
/run/docker/netns); their values for the comment and --cgroup/--container's target cgroup."""

from __future__ import annotations

import os
import time

from fcap.errors import PredicateError
from fcap.host import containers

MOUNTINFO = "/proc/self/mountinfo"
# where container runtimes keep their containers' names (--container NAME): podman's (rootful) storage, docker's
PODMAN_CONTAINERS = "/var/lib/containers/storage/overlay-containers/containers.json"
DOCKER_CONTAINERS = "/var/lib/docker/containers"
NETNS_DIRS = (("/run/netns", ""), ("/run/docker/netns", "docker:"))
REFRESH_NS = 1_000_000_000      # an id a walk did not find makes the next walk no sooner than this


def cgroup2_mount(mountinfo: str = MOUNTINFO) -> str | None:
    """Where the cgroup2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid systems)."""
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split()[4].replace("\\040", " ")
    except OSError:
        return None
    return None


class _Cache:
    """inode -> name, made by `scan` and made again on a miss (a key the last scan did not find either: not before
    REFRESH_NS have passed, so that a cgroup gone does not make every packet walk)."""

    def __init__(self, scan):
        self.scan, self.names, self.when, self.missed = scan, {}, 0, set()

    def get(self, key: int):
        if key in self.names:
            return self.names[key]
        now = time.monotonic_ns()
        if key not in self.missed or now - self.when >= REFRESH_NS:
            self.names, self.when = self.scan(), now
            self.missed = set() if key in self.names else {key}
        elif key not in self.names:
            return None
        return self.names.get(key)


def _scan_cgroups(root: str | None) -> dict:
    out = {}
    if root is None:
        return out
    for dirpath, _dirs, _files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        try:
            out[os.stat(dirpath).st_ino] = "/" if rel == "." else "/" + rel.replace(os.sep, "/")
        except OSError:
            continue
    return out


def _scan_netns() -> dict:
    out = {}
    for folder, prefix in NETNS_DIRS:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            try:
                out.setdefault(os.stat(os.path.join(folder, name)).st_ino, prefix + name)
            except OSError:
                continue
    return out


class CgroupNames:
    """cgroup id -> its path under the cgroup2 mount ("/" the root, "/system.slice/x.scope"), or None."""

    def __init__(self, root: str | None = None):
        self.root = root if root is not None else cgroup2_mount()
        self._cache = _Cache(lambda: _scan_cgroups(self.root))

    def path(self, cgroup_id: int) -> str | None:
        return self._cache.get(cgroup_id) if cgroup_id else None

    def target(self, path: str) -> tuple[int, int, str]:
        """--cgroup PATH: (id, level below the root, path) of the cgroup at PATH (relative to the cgroup2 mount, or a
        full path under it). PredicateError when there is none."""
        if self.root is None:
            raise PredicateError("--cgroup: no cgroup2 hierarchy is mounted (see /proc/self/mountinfo)")
        root = os.path.realpath(self.root)
        full = os.path.realpath(path if path.startswith(root + "/") or path == root
                                else os.path.join(root, path.lstrip("/")))
        if not (full == root or full.startswith(root + "/")) or not os.path.isdir(full):
            raise PredicateError(f"--cgroup: no cgroup {path!r} under {self.root}")
        rel = os.path.relpath(full, root)
        parts = [] if rel == "." else rel.split(os.sep)
        return os.stat(full).st_ino, len(parts), "/" + "/".join(parts)

    def container(self, name: str) -> tuple[int, int, str]:
        """--container NAME: the target (as target()) of the container's cgroup, NAME its id, a prefix of it, its
        pod's uid, or the name podman or docker gave it; the outermost cgroup that names it (a pod: the pod's)."""
        scan = sorted(_scan_cgroups(self.root).items(), key=lambda kv: kv[1].count("/"))
        found = []
        for key in [name] + runtime_ids(name):
            for _ino, path in scan:
                c = containers.parse(path)
                if c is not None and containers.matches(c, key):
                    found.append(path)
            if found:
                break
        if not found:
            raise PredicateError(f"--container: no cgroup of a container or pod {name!r} under "
                                 f"{self.root or 'a cgroup2 mount'}")
        others = [p for p in found if not (p + "/").startswith(found[0] + "/")]   # (not under the outermost)
        if others:
            raise PredicateError(f"--container: {name!r} names several containers ({found[0]}, {others[0]}); "
                                 "give more of the id")
        return self.target(found[0])


def runtime_ids(name: str) -> list[str]:
    """The ids of the containers podman (rootful) or docker named `name`, from their own records."""
    import json
    out = []
    try:
        with open(PODMAN_CONTAINERS) as f:
            out += [c["id"] for c in json.load(f) if name in (c.get("names") or ())]
    except (OSError, ValueError, TypeError, KeyError):
        pass
    try:
        ids = sorted(os.listdir(DOCKER_CONTAINERS))
    except OSError:
        ids = []
    for cid in ids:
        try:
            with open(os.path.join(DOCKER_CONTAINERS, cid, "config.v2.json")) as f:
                if json.load(f).get("Name", "").lstrip("/") == name:
                    out.append(cid)
        except (OSError, ValueError, AttributeError):
            continue
    return out


class NetnsNames:
    """Network namespace inode -> its name (`ip netns` names; docker's as docker:NAME), or None."""

    def __init__(self):
        self._cache = _Cache(_scan_netns)

    def name(self, inum: int) -> str | None:
        return self._cache.get(inum) if inum else None


class Context:
    """The context of each record of a --context capture, for its comment and its Packet."""

    def __init__(self):
        self.cgroups, self.netns = CgroupNames(), NetnsNames()

    def warm(self) -> None:
        """Walk the cgroup2 tree and the namespaces' names now, not at the first record (which a flood's first
        milliseconds wait for where the programs ask for the names: fcap.features.packet_context)."""
        self.cgroups.path(1)
        try:
            self.netns.name(os.stat("/proc/self/ns/net").st_ino)
        except OSError:
            pass

    def values(self, rec) -> dict:
        """{Packet attribute: value}: cgroup, cgroup_path, container, pod, netns_name (None: unknown)."""
        path = self.cgroups.path(rec.cgroup)
        c = containers.parse(path) if path else None
        return {"cgroup": rec.cgroup or None, "cgroup_path": path, "container": (c.text() or None) if c else None,
                "pod": (c.pod or None) if c else None, "netns_name": self.netns.name(rec.netns)}

