"""--context: each packet's cgroup (its socket's, else the task's), recorded by the programs (fcap.kernel.context),
named in user space (fcap.host.ctxnames): cgroup path, container, pod and the network namespace's name."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, keyed_text

# What the comment of a --context capture adds after the metadata's: (text before, Packet attribute, style); a key
# whose value is unknown is left out
COMMENT = ((" cgroup=", "cgroup", "dec64"), (" cgroup_path=", "cgroup_path", "str"),
           (" container=", "container", "str"), (" pod=", "pod", "str"), (" netns_name=", "netns_name", "str"))


class ContextNames(Annotator):
    def __init__(self):
        from fcap.host.ctxnames import Context
        self.context = Context()

    def text(self, rec) -> str:
        return keyed_text(COMMENT, self.context.values(rec))

    def values(self, rec) -> dict:
        return self.context.values(rec)


FEATURE = PacketFeature(
    "context", comment=COMMENT, flag="--context", room="context", option=True, program=("cgroup",),
    help="record each packet's cgroup (its socket's, else the task's) and name it: cgroup path, container, pod and "
         "network namespace name in the comment, --json and the API",
    annotator=lambda session: ContextNames() if session.cfg.context else None,
    user_space=lambda cfg, points: cfg.context)   # (the names are user space's)
