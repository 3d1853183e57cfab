"""What `fcap --help` and `man fcap` say beyond the flags: the -i spellings, the semantic points, the commands and
examples. The spellings come from the tables the code resolves points with (fcap.points.kinds.ALL, the semantic
TABLE), so the help cannot name a kind or a semantic point the grammar lacks, nor miss one it has."""

from __future__ import annotations

import textwrap
from typing import NamedTuple


class Section(NamedTuple):
    """One part of the help after the flags: a title, a sentence under it, and (term, what it means) rows."""

    title: str
    intro: str
    rows: tuple[tuple[str, str], ...]


# (command, what it does): the README's, the first thing a reader of the man page copies
EXAMPLES: tuple[tuple[str, str], ...] = (
    ("fcap -i tp_btf/net_dev_queue -w out.pcapng 'udp port 53'", "tcpdump's filter syntax, run inside the kernel"),
    ("fcap -i tp_btf/net_dev_queue -w out.pcapng -- ping -c 3 127.0.0.1", "capture while COMMAND runs"),
    ("fcap -i fentry/ip_output -y raw -w out.pcap", "every packet that passed through ip_output"),
    ("fcap -i tp_btf/netif_receive_skb | wireshark -k -i -", "a live stream into Wireshark"),
    ("fcap -i 'tp_btf/net_dev_*' -w dev.pcapng", "a glob: every matching point, one interface each"),
    ("fcap -i skb:drop -w drops.pcapng 'udp port 53'", "dropped packets, the reason and where in each"),
    ("fcap -i dev:queue -i dev:receive -i skb:drop --track -w t.pcapng 'udp port 53'",
     "one packet followed from point to point"),
    ("fcap -i tp_btf/net_dev_queue -w go.pcapng --tls-secrets 'tcp port 443' -- ./client https://example.test/",
     "a Go program's TLS secrets in the file (uprobes): tshark -r go.pcapng -Y http.request decrypts"),
    ("fcap path t.pcapng", "per packet: points in order, time between, how it ended"),
    ("fcap drops -- ./my-test.sh", "drops per reason and location, a table on exit"),
    ("fcap -i tp_btf/net_dev_queue --where 'skb->len > 1000' --dump 'skb->dev'", "a BTF field test; a member shown"),
    ("fcap -r out.pcapng -tttt", "read a file back, dates and times"),
    ("fcap list-devices 'ip_*'", "every point whose name matches, with its prototype"),
    ("fcap info ip_send_skb", "a point's prototype"),
)


def point_rows() -> tuple[tuple[str, str], ...]:
    """How -i spells a point: one row per kind (from the kinds the grammar knows), then the other spellings."""
    from fcap.points import kinds
    rows = [(f"{k.name}/{k.operand}", k.summary) for k in kinds.ALL]
    default = kinds.FENTRY.name
    return tuple(rows) + (
        ("FUNC or TP", f"a bare name: the tracepoint by that name, else FUNC with {default} (the best hook)"),
        ("POINT:ARG", "the struct sk_buff * argument called ARG, where a point has several "
                      "(fentry/skb_try_coalesce:from)"),
        ("KIND/GLOB, GLOB", f"every point a glob names (*, ?, [...] over list-devices' names): {default}/ip_*, "
                            "'tcp_*'"),
        ("xdp/PROG, tc/PROG", "a loaded XDP or tc program by name or id: its entry and its exit (with the "
                              "verdict), two interfaces"),
        ("LAYER:EVENT", "a semantic point, below"),
    )


def semantic_rows() -> tuple[tuple[str, str], ...]:
    """Each semantic point and what it means, from the table that resolves them."""
    from fcap.points.semantic import TABLE
    return tuple((name, meaning) for name, (meaning, _hooks) in TABLE.items())


def sections(commands) -> tuple[Section, ...]:
    """The help's parts after the flags; `commands` are the subcommands (fcap.commands.cli.COMMANDS)."""
    return (
        Section("capture points (-i POINT)",
                "-i repeats: each -i adds its points to the one capture (a pcapng interface each, packets in time "
                "order, packet ids across points); a glob adds every point it matches.",
                point_rows()),
        Section("semantic points",
                "Stable names over an unstable kernel: each is a list of hooks, the first this kernel serves is taken "
                "(fcap list-devices --semantic shows which).",
                semantic_rows()),
        Section("subcommands", "fcap NAME ... for what is not capturing or reading (fcap NAME --help for its flags).",
                tuple((f"{c.name} {c.args}".strip(), c.summary) for c in commands)),
        Section("examples", "", EXAMPLES),
    )


def epilog(commands) -> str:
    """The sections as `fcap --help` prints them after the flags: a title, its sentence, the rows aligned."""
    out = []
    for s in sections(commands):
        out.append(f"{s.title}:")
        if s.intro:
            out.append(textwrap.fill(s.intro, 100, initial_indent="  ", subsequent_indent="  "))
        width = max(len(term) for term, _ in s.rows)
        if width > 40:   # (the examples: each command, then what it does under it)
            out += [f"  {term}\n      {what}" for term, what in s.rows]
        else:
            out += [f"  {term.ljust(width)}  {what}" for term, what in s.rows]
        out.append("")
    return "\n".join(out).rstrip() + "\n"
