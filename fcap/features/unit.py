"""What a per-packet feature is, as one unit (fcap.features.FEATURES holds them): the program's half it puts in
(fcap.kernel.parts.Parts), the flag and API keyword that ask for it, what it refuses, its keys in the record's
comment, and user space's half for each capture (an Annotator: the comment's text, the Packet's attributes, the
printed line's words and what prints under it).

A unit imports its kernel half (fcap.kernel, fcap.host) where it uses it, not at the top of its module: the command
line reads every unit's declaration, and `fcap -r` needs none of the kernel's modules (their imports were ~60% of
its start-up)."""

from __future__ import annotations

from typing import Callable, NamedTuple


class Annotator:
    """User space's half of a feature in one capture, per record (fcap.kernel.layout.Record): its part of the
    comment (text: each key with the space before it, '' when it has nothing to say), the Packet attributes it
    gives (values), its words between the printed line's brackets (printed: the comment's text unless said
    otherwise), what it prints under the line (below), and the pcapng options of its own it adds to the record's
    block (options: keyword arguments of PcapngWriter.write, comments and more)."""

    def text(self, rec) -> str:
        return ""

    def values(self, rec) -> dict:
        return {}

    def printed(self, rec) -> str:
        return self.text(rec)

    def below(self, printer, rec) -> None:
        """Lines under the packet's (printer: a fcap.text.printer.Printer)."""

    def options(self, rec) -> dict:
        return {}


def keyed_text(keys: tuple, values: dict) -> str:
    """A unit's part of the comment: each of its keys (text before, attribute, style) whose value is known, as
    f"{text before}{value}" (the values as the comment writes them)."""
    return "".join(f"{pre}{values[attr]}" for pre, attr, _s in keys if values.get(attr) is not None)


class Setting(NamedTuple):
    """A further flag of a flagged feature (repeatable: its values a tuple), the Config field and API keyword
    `name`; given without the feature's own flag, it is refused."""

    flag: str
    name: str
    metavar: str
    help: str


class Shorthand(NamedTuple):
    """A flag (and API keyword `name`) that stands for one value of a valued feature's flag, as --ct for the dump of
    the conntrack entry; it needs no other flag."""

    flag: str
    name: str
    value: str
    room: str    # what it copies ("conntrack entry"), for Wireshark's dialog
    help: str


class PacketFeature(NamedTuple):
    """One per-packet feature (see the module's docstring). A flagged feature is asked for by `flag` on the command
    line and by the keyword `name` in the API, both becoming the capture Config's field `name`: True, or with a
    metavar the values given (the flag repeatable), its shorthands' values among them."""

    name: str
    comment: tuple = ()          # its keys in the comment: (text before, Packet attribute, style) per key
    flag: str = ""               # the command-line flag that asks for it ("": on wherever the points call for it)
    help: str = ""               # the flag's help
    metavar: str = ""            # the flag takes a value (repeatable), named so in the help
    shorthands: tuple = ()       # flags standing for one of its values (Shorthand)
    settings: tuple = ()         # its further flags (Setting)
    room: str = ""               # what it writes into pcapng's comment ("the context"): pcap and --no-comment refuse
                                 # it ("": nothing of it is refused)
    option: bool = False         # the capture programs take it as the ProgramOptions field `name`
    program: tuple = ()          # the names of its fcap.kernel.parts.Parts (the program's half), for the reader
    annotator: Callable | None = None   # (session) -> Annotator, or None where it has nothing to say in this capture
    refuse: Callable | None = None      # (points) -> why the capture cannot have it (a line), or "" (asked for)
    user_space: Callable | None = None  # (cfg, points) -> the records must be laid out in user space (no file
                                        # rings: the programs cannot write what it says)

    def asked(self, cfg) -> bool:
        """Is it asked for in this capture's Config (a flagged feature; an unflagged one is never asked for)?"""
        return bool(self.flag) and bool(getattr(cfg, self.name))

    def flag_of(self, cfg) -> str:
        """The flag that asked for it, for an error line: a shorthand's when only shorthands did."""
        values = getattr(cfg, self.name) if self.metavar else ()
        said = [s.flag for s in self.shorthands if s.value in values]
        return said[0] if said and len(said) == len(values) else self.flag
