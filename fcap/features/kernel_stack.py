"""--stack: the kernel stack of each packet at its point (FUNC+0xOFF per frame, innermost first), the programs'
stack ids (fcap.kernel.kstack) named from /proc/kallsyms; the comment ends with it, the printed line has it under."""

from __future__ import annotations

from fcap.features.unit import Annotator, PacketFeature, keyed_text

# What a record's comment ends with: ' stack=FUNC+0xOFF<CALLER+0xOFF<...' (fcap.kernel.kstack.text: '?' unknown)
COMMENT = ((" stack=", "stack", "str"),)


class StackFrames(Annotator):
    def text(self, rec) -> str:
        return comment_text(rec.stack) if rec.stack is not None else ""

    def values(self, rec) -> dict:
        return {"stack": rec.stack}

    def printed(self, rec) -> str:
        return ""   # (under the line instead)

    def below(self, printer, rec) -> None:
        if rec.stack is not None:
            printer.stack(rec.stack)


def comment_text(stack: tuple) -> str:
    """What the comment of a record with these frames ends with (() unknown)."""
    from fcap.kernel.kstack import text
    return keyed_text(COMMENT, {"stack": text(stack)})


# (into a file: where the programs write the file rings, they write each id's frames too, as user space gives them
# when it first reads the id (fcap.kernel.kstack.Stacks); else the perf buffer's blocks, each comment made once per
# stack id and metadata: fcap.live.drain.FileDrain's options cache)
FEATURE = PacketFeature(
    "stack", comment=COMMENT, flag="--stack", room="stack", option=True, program=("stack",),
    help="the kernel stack of each packet at its point (FUNC+0xOFF, innermost first; names from /proc/kallsyms)",
    annotator=lambda session: StackFrames() if session.cfg.stack else None)
