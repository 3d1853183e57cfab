"""--stack: the kernel stack of each packet at its point (FUNC+0xOFF per frame, innermost first), the programs'
stack ids (fcap.kernel.kstack) named from /proc/kallsyms; the comment ends with it, the printed line has it under."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, keyed_text

# What a record's comment ends with: ' stack=FUNC+0xOFF<CALLER+0xOFF<...' (fcap.kernel.kstack.text: '?' unknown)
COMMENT = ((" stack=", "stack", "str"),)


class StackFrames(Annotator):
    def __init__(self) -> None:
        from fcap.kernel.kstack import text
        self.frames = text

    def text(self, rec) -> str:
        return keyed_text(COMMENT, {"stack": self.frames(rec.stack)}) if rec.stack is not None else ""

    def values(self, rec) -> dict:
        return {"stack": rec.stack}

    def printed(self, rec) -> str:
        return ""   # (under the line instead)

    def below(self, printer, rec) -> None:
        if rec.stack is not None:
            printer.stack(rec.stack)


# (the frames are user space's: no file rings; into a file, the perf buffer's blocks, each comment made once per stack
# id and metadata: fcap.live.drain.FileDrain's options cache)
FEATURE = PacketFeature(
    "stack", comment=COMMENT, flag="--stack", room="stack", option=True, program=("stack",),
    help="the kernel stack of each packet at its point (FUNC+0xOFF, innermost first; names from /proc/kallsyms)",
    annotator=lambda session: StackFrames() if session.cfg.stack else None,
    user_space=lambda cfg, points: cfg.stack)
