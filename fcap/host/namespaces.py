"""Network namespaces fcap can enter, and code run inside one: named as `ip netns` names them (/run/netns/NAME,
docker's /run/docker/netns/ID), by a namespace file's path (a pod's or a container's /proc/PID/ns/net), or every
one found (those, and every process's). A socket made inside stays there when the thread comes back out."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from typing import NamedTuple

from bpf.sys import CLONE_NEWNET, setns

from fcap.errors import CaptureError
from fcap.host.ctxnames import NETNS_DIRS

EVERY = "all"
OWN = "/proc/thread-self/ns/net"
NS_GET_NSTYPE = 0xB703   # ioctl on a namespace file: its CLONE_NEW* type


class Netns(NamedTuple):
    """A network namespace: what the user called it, the file that is it, its inode number (records' netns)."""

    label: str
    path: str
    inum: int


def own() -> Netns:
    return Netns("", OWN, os.stat(OWN).st_ino)


def find(where: str) -> list[Netns]:
    """The namespaces WHERE names: EVERY (each found, but this thread's own), an `ip netns` or docker name, or a
    namespace file's path. CaptureError when there is none."""
    if where == EVERY:
        return every()
    if "/" in where:
        candidates = [where]
    else:
        candidates = [os.path.join(folder, where[len(prefix):]) for folder, prefix in NETNS_DIRS
                      if where.startswith(prefix)]
    for path in candidates:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if _is_netns(path):
            return [Netns(where, path, st.st_ino)]
    raise CaptureError(f"--nft-netns {where}: no such network namespace (a name of `ip netns list`, a path such as "
                       f"/proc/PID/ns/net, or {EVERY})")


def every() -> list[Netns]:
    """Each network namespace found, once, but this thread's own: the named ones (ip netns, docker), then every
    process's (/proc/PID/ns/net, labelled by the pid)."""
    seen, out = {own().inum}, []
    named = [(prefix + name, os.path.join(folder, name)) for folder, prefix in NETNS_DIRS
             for name in _listdir(folder)]
    procs = [(f"pid {pid}", f"/proc/{pid}/ns/net") for pid in sorted(int(p) for p in _listdir("/proc") if p.isdigit())]
    for label, path in named + procs:
        try:
            inum = os.stat(path).st_ino
        except OSError:
            continue
        if inum not in seen and _is_netns(path):
            seen.add(inum)
            out.append(Netns(label, path, inum))
    return out


@contextlib.contextmanager
def inside(ns: Netns) -> Iterator[None]:
    """Run the block with this thread in namespace `ns` (OSError: fcap may not enter it), then back in its own."""
    back = os.open(OWN, os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(ns.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(target, CLONE_NEWNET)
        finally:
            os.close(target)
        try:
            yield
        finally:
            setns(back, CLONE_NEWNET)
    finally:
        os.close(back)


def _is_netns(path: str) -> bool:
    """Whether the file is a network namespace (the kernel's answer: NS_GET_NSTYPE, 4.11)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWNET
    except OSError:
        return False
    finally:
        os.close(fd)


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []
