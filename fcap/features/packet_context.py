"""--context: each packet's cgroup (its socket's, else the task's), recorded by the programs (fcap.kernel.context),
named in user space (fcap.host.ctxnames): cgroup path, container, pod and the network namespace's name."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature
from fcap.host.ctxnames import CONTEXT_COMMENT, Context
from fcap.kernel.context import CGROUP


class ContextNames(Annotator):
    def __init__(self):
        self.context = Context()

    def text(self, rec) -> str:
        return self.context.text(rec)

    def values(self, rec) -> dict:
        return self.context.values(rec)


FEATURE = PacketFeature(
    "context", comment=CONTEXT_COMMENT, flag="--context", room="context", option=True, program=(CGROUP,),
    help="record each packet's cgroup (its socket's, else the task's) and name it: cgroup path, container, pod and "
         "network namespace name in the comment, --json and the API",
    annotator=lambda session: ContextNames() if session.cfg.context else None,
    user_space=lambda cfg, points: cfg.context)   # (the names are user space's)
