"""The container and Kubernetes pod a cgroup path names, from the layouts container runtimes make (a pure parser):
systemd's driver (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`,
`kubepods-<qos>-pod<uid>.slice`) and cgroupfs' (`/docker/<id>`, `/libpod_parent/libpod-<id>`,
`/kubepods/<qos>/pod<uid>/<id>`)."""

from __future__ import annotations

import re
from typing import NamedTuple

_ID = r"([0-9a-f]{64})"
# a path component -> the runtime it names (systemd's scope units; a conmon scope is podman's monitor, no container)
_SCOPES = ((re.compile(rf"^docker-{_ID}\.scope$"), "docker"),
           (re.compile(rf"^cri-containerd-{_ID}\.scope$"), "containerd"),
           (re.compile(rf"^crio-{_ID}\.scope$"), "cri-o"),
           (re.compile(rf"^libpod-{_ID}\.scope$"), "podman"),
           (re.compile(rf"^libpod-{_ID}$"), "podman"))
# a pod: systemd's `kubepods-besteffort-pod<uid with _>.slice`, cgroupfs' `pod<uid>`
_POD_SLICE = re.compile(r"^kubepods(?:-[a-z]+)*-pod([0-9a-f_]{36})\.slice$")
_POD_DIR = re.compile(r"^pod([0-9a-f-]{36})$")
_BARE = re.compile(rf"^{_ID}$")
_PARENTS = {"docker": "docker", "libpod_parent": "podman"}   # cgroupfs' parent directory -> runtime


class Container(NamedTuple):
    runtime: str          # docker, containerd, cri-o, podman; "" for a pod's cgroup above its containers
    id: str               # the container id (64 hex digits), "" for a pod's cgroup
    pod: str = ""         # the Kubernetes pod uid, "" outside a pod

    def text(self) -> str:
        """How the comment and --container show it: runtime:id."""
        return f"{self.runtime}:{self.id}" if self.id else ""


def parse(path: str) -> Container | None:
    """The container (and pod) the cgroup path names, the innermost one; None for a cgroup of no container."""
    parts = [p for p in path.split("/") if p]
    pod = runtime = cid = ""
    in_kube = False
    for i, part in enumerate(parts):
        m = _POD_SLICE.match(part)
        if m:
            pod = m.group(1).replace("_", "-")
            continue
        m = _POD_DIR.match(part)
        if m and in_kube:
            pod = m.group(1)
            continue
        if part.startswith("kubepods"):
            in_kube = True
            continue
        for rx, name in _SCOPES:
            m = rx.match(part)
            if m:
                runtime, cid = name, m.group(1)
                break
        else:
            m = _BARE.match(part)
            if m and i > 0 and (parts[i - 1] in _PARENTS or pod):
                runtime, cid = _PARENTS.get(parts[i - 1], "cri"), m.group(1)
    if not cid and not pod:
        return None
    return Container(runtime, cid, pod)


def matches(container: Container, name: str) -> bool:
    """Whether --container NAME names this container: its id or a prefix of it (as docker takes one), runtime:id,
    or its pod's uid."""
    name = name.lower()
    if container.id and (container.id.startswith(name) or container.text().startswith(name)):
        return True
    return bool(container.pod) and name in (container.pod, "pod" + container.pod)
