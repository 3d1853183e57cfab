"""man fcap, written from the parser `fcap` parses its flags with and the help's sections (fcap.commands.usage), so
the page says what the command does. `python -m fcap.commands.manpage > man/fcap.1` regenerates the checked-in page
(tests/test_manpage.py fails while it differs). Our own ~100 lines rather than argparse-manpage: a build-time
dependency for one page, and it knows neither our lazily built sections nor the subcommands."""

from __future__ import annotations

import argparse
import sys

from fcap import __version__
from fcap.commands.usage import Section, sections

NBSP = "\\ "   # roff's unbreakable space
SEE_ALSO = "tcpdump(8), pcap\\-filter(7), pcap\\-savefile(5), wireshark(1), tshark(1), bpftool(8)"

DESCRIPTION = (
    "fcap captures packets at any point inside the Linux network stack: a kernel function or tracepoint that takes a "
    "struct sk_buff *, found in the kernel's BTF. It generates the eBPF program itself (no libbpf, no LLVM), runs "
    "tcpdump's filter expression inside the kernel, and writes pcap or pcapng files, or prints the packets as "
    "tcpdump does. Its flags are tcpdump's where tcpdump has them; -i names a capture point instead of a device.",
    "Without -w, packets are printed on a terminal; on a pipe they go out as a pcapng stream "
    "(fcap -i POINT | wireshark -k -i -), unless a printing flag (-n, -l, -e, -v, ...) asks for lines. "
    "With -r, fcap reads a pcap or pcapng file and prints it. "
    "After --, a COMMAND is run and the capture ends when it exits. fcap needs root, or CAP_BPF and CAP_PERFMON.",
)


def roff(text: str) -> str:
    """Text as roff reads it literally: backslashes and hyphens escaped, no line taken for a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in text.split("\n"))


def _flag(action: argparse.Action, synopsis: bool = False) -> str:
    """An option as the page heads it: its spellings in bold, its argument in italics (argparse's metavar, or the
    choices). In the synopsis: the first spelling only, held to its argument by unbreakable spaces."""
    names = ", ".join(f"\\fB{roff(s)}\\fR" for s in action.option_strings[:1 if synopsis else None])
    if action.nargs == 0:
        return names
    arg = action.metavar or ("|".join(action.choices) if action.choices else action.dest.upper())
    arg = f"\\fI{roff(arg)}\\fR"
    if not synopsis:
        return f"{names} {arg}"
    return (names + " " + arg).replace(" ", NBSP)


def _help(action: argparse.Action, prog: str) -> str:
    """An action's help with argparse's %-escapes expanded, as --help prints it."""
    params = dict(vars(action), prog=prog)
    return (action.help or "") % params


def _synopsis(parser: argparse.ArgumentParser, commands) -> list[str]:
    """Every flag in brackets, as tcpdump's page opens; then a line per subcommand."""
    flags = [f"[{_flag(a, synopsis=True)}]" for a in parser._actions
             if a.option_strings and a.help is not argparse.SUPPRESS]
    lines = [".SY fcap", *flags, "[\\fIexpression\\fR] [\\fB\\-\\-\\fR \\fIcommand\\fR ...]", ".YS"]
    for c in commands:
        lines += [".SY fcap", f"\\fB{roff(c.name)}\\fR", roff(c.args), ".YS"]
    return lines


def _options(parser: argparse.ArgumentParser) -> list[str]:
    """The OPTIONS section: the flags in the parser's order, each group of them under its own title."""
    out = [".SH OPTIONS"]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        if group is not parser._optionals and group is not parser._positionals:
            out.append(f".SS {roff(group.title[:1].upper() + group.title[1:])}")
        for a in actions:
            out += [".TP", _flag(a) if a.option_strings else f"\\fI{roff(a.metavar or a.dest)}\\fR",
                    roff(_help(a, parser.prog))]
    return out


def _section(s: Section) -> list[str]:
    out = [f".SH {roff(s.title.split(' (')[0].upper())}"]
    if s.intro:
        out += [roff(s.intro)]
    if s.title == "examples":
        for command, what in s.rows:
            out += [".PP", roff(what) + ":", ".RS", ".EX", roff(command), ".EE", ".RE"]
        return out
    for term, what in s.rows:
        out += [".TP", f"\\fB{roff(term)}\\fR", roff(what)]
    return out


def manpage(parser: argparse.ArgumentParser, commands) -> str:
    """The page, in roff (man macros): NAME, SYNOPSIS, DESCRIPTION, OPTIONS, the help's sections, SEE ALSO."""
    lines = [f'.TH FCAP 1 "" "fcap {__version__}" "User Commands"',
             ".SH NAME", f"fcap \\- {roff(parser.description or '')}",
             ".SH SYNOPSIS", *_synopsis(parser, commands),
             ".SH DESCRIPTION"]
    for paragraph in DESCRIPTION:
        lines += [".PP", roff(paragraph)]
    lines += _options(parser)
    for s in sections(commands):
        lines += _section(s)
    lines += [".SH SEE ALSO", SEE_ALSO]
    return "\n".join(lines) + "\n"


def main() -> int:
    from fcap.commands.cli import COMMANDS, _parser
    sys.stdout.write(manpage(_parser(), COMMANDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
