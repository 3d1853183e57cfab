"""The parts of the capture program, each declared once (a part: what the program does for one per-packet matter).

A capture program (fcap.kernel.program.Builder) is a fixed skeleton (the skb from the context, the scratch value, the
metadata the link headers need, the link header bytes, the timestamp and task, the copy length) with the parts
a capture asks for put in at named stages. A Part says:
- on: whether it is on for this program (from the point, the program's ProgramOptions and its Maps);
- fields, flags, layouts: what it writes into the record (META's fields and flags, other declared layouts such as
  the dump area; the layouts themselves are declared once, in fcap.kernel.layout);
- maps: which of the program's maps it uses (Maps attributes) and who makes them;
- stages: what it emits, and where (a function of the builder per stage);
- reads: what user space reads back of it, if anything (a dotted name: fcap.kernel does not import the floors that
  read);
- turns_away: whether it may leave for "out" before the record is made (predicates, filter, tracking).
The builder runs each stage's parts in program.PARTS' order, so the order of a stage's parts is declared
there too. A part whose code another part's stage emits (the pcapng comment, inside the file ring's record)
names that one in `within` instead of having stages of its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

# ---- stages, in program order ----------------------------------------------------------------------------------
# (R6: the skb, R7: this point's scratch value (META) throughout; "out" leaves without a record)
ENTRY = "entry"                  # the scratch value found (STACK.key: the point id); before the predicates
SELECT = "select"                # the predicates: a jump to "out" turns the packet away
SELECTED = "selected"            # past the predicates
DEVICE = "device"                # META's skb, len, protocol, pkt_type and device are in (only where the device is
                                 # recorded: with the metadata, or for a LINUX_SLL2 header)
HEADERS = "headers"              # the link header bytes made and copied: R8 = hdr_total, META's hdr and skip
BEFORE_FILTER = "before_filter"  # before the filter runs
FILTER = "filter"                # the filter: a jump to "out" turns the packet away
KEPT = "kept"                    # the packet will be recorded
RECORD_META = "record_meta"      # the timestamp and the task are in; what only the record needs
BEFORE_COPY = "before_copy"      # META complete, before the copy length is worked out
WRITE = "write"                  # the record written: R2 = copy, R8 = hdr_total in; R0 = 0 or < 0 (lost) out
END = "end"                      # after the write (R0: its result), before "out"
STAGES = (ENTRY, SELECT, SELECTED, DEVICE, HEADERS, BEFORE_FILTER, FILTER, KEPT, RECORD_META, BEFORE_COPY, WRITE,
          END)

Emit = Callable[["object"], None]          # (builder) -> None: emits into the builder
When = Callable[["object", "object", "object"], bool]   # (point, options, maps) -> on for this program


class MapUse(NamedTuple):
    """A map a part's code uses: the Maps attribute holding its fd, and what it is (type, value, who makes it)."""

    attr: str
    what: str


def always(point, options, maps) -> bool:
    return True


def has_skb(point) -> bool:
    """Is the point's packet an skb (not an XDP program's xdp_buff)?"""
    return point.kind.on_skb


@dataclass(frozen=True, eq=False)
class Part:
    """One part of the capture program (see the module's docstring)."""

    name: str
    on: When
    stages: dict = field(default_factory=dict)       # stage -> Emit
    fields: tuple = ()                               # META fields it writes
    flags: tuple = ()                                # META flags it sets
    maps: tuple = ()                                 # MapUse
    layouts: tuple = ()                              # other fcap.kernel.layout declarations it writes (by name)
    reads: str = ""                                  # user space's reader (dotted name), "" for none
    within: str = ""                                 # the part whose stage emits this one's code
    turns_away: bool = False                         # may leave for "out" before the record (the clock is read
                                                     # after it; else first: fcap.kernel.program.Builder.clock_first)

    def __post_init__(self):
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise ValueError(f"part {self.name}: no such stage {sorted(unknown)}")

    def emitter(self, stage: str) -> Emit | None:
        return self.stages.get(stage)


def active(parts: tuple, point, options, maps) -> list:
    """The parts on for one program, in their declared order."""
    return [f for f in parts if f.on(point, options, maps)]
