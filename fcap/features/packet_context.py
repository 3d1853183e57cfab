"""--context: each packet's cgroup (its socket's, else the task's), recorded by the programs (fcap.kernel.context),
named in user space (fcap.host.ctxnames): cgroup path, container, pod and the network namespace's name. Where the
programs write the file rings, they write the names too, as user space gives them (fcap.kernel.ringrec)."""

from __future__ import annotations

import time

from fcap.features.unit import Annotator, PacketFeature, keyed_text
from fcap.kernel.layout import CTX_KEY, CTX_MAX, CTX_TEXT

# What the comment of a --context capture adds after the metadata's: (text before, Packet attribute, style); a key
# whose value is unknown is left out
COMMENT = ((" cgroup=", "cgroup", "dec64"), (" cgroup_path=", "cgroup_path", "str"),
           (" container=", "container", "str"), (" pod=", "pod", "str"), (" netns_name=", "netns_name", "str"))


class ContextNames(Annotator):
    """The names of each record's context; where the programs write the file rings (`given`: the session's map,
    fcap.kernel.ringrec), each text made is given to them too, for the packets of its (cgroup, netns) to come: for
    REFRESH_NS, after which they ask again (names found since). The file drains make a block's options again every
    half of that (fcap.live.session's _names_refresh), so that the packets that ask are named here."""

    def __init__(self, given=None):
        from fcap.host.ctxnames import Context
        self.context = Context()
        self.given = given
        if given is not None:
            self.context.warm()
        self.until: dict = {}   # key -> when what the map holds for it expires

    def text(self, rec) -> str:
        text = keyed_text(COMMENT, self.context.values(rec))
        if self.given is not None:
            self._give(rec, text)
        return text

    def _give(self, rec, text: str) -> None:
        from fcap.host.ctxnames import REFRESH_NS
        data, now = text.encode(), time.monotonic_ns()
        key = CTX_KEY.struct.pack(rec.cgroup, rec.netns)
        if len(data) > CTX_MAX or self.until.get(key, 0) - now > REFRESH_NS // 2:
            return   # (given, and for long enough yet: a text made in its last half second gives it again)
        self.until[key] = now + REFRESH_NS
        try:
            self.given.update(key, CTX_TEXT.struct.pack(len(data), now + REFRESH_NS, data))
        except OSError:   # (full: its packets go on through the perf buffer, named here)
            self.until.pop(key)

    def values(self, rec) -> dict:
        return self.context.values(rec)


FEATURE = PacketFeature(
    "context", comment=COMMENT, flag="--context", room="context", option=True, program=("cgroup",),
    help="record each packet's cgroup (its socket's, else the task's) and name it: cgroup path, container, pod and "
         "network namespace name in the comment, --json and the API",
    annotator=lambda session: ContextNames(session.ctx_names) if session.cfg.context else None)
