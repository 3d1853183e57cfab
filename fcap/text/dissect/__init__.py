"""Protocol printers: what tcpdump -nn (and -v) prints after the timestamp, from the link layer to
TCP/UDP/ICMP/ARP.

Layers, each importing only those below it: reader (the packet and its bounds-checked reads), cksum (-v's internet
checksums), mptcp (the MPTCP option), icmp6_info (ICMPv6 node information, router renumbering, RPL) and icmp6_nd
(-v's neighbour discovery), transport (TCP with its options, UDP), icmp (ICMP) and icmp6 (ICMPv6), ipopts (IPv4's
options, IPv6's hop-by-hop and destination options), ip (IPv4, IPv6 and its extension headers, the demux to what
they carry), link (Ethernet, cooked, loopback, raw IP, ARP). dissect() below is the one entry point, of the
printed lines and of --json's headers alike: each printer records the fields it read (PrintState.layer) as it
prints them.
"""

from __future__ import annotations

from typing import NamedTuple

from fcap.text.dissect.link import dissect_link
from fcap.text.dissect.reader import PrintState, Truncated

__all__ = ["Dissected", "dissect"]


class Dissected(NamedTuple):
    """A packet as tcpdump prints it: its line; the length of its link-level header as tcpdump counts it for -x
    and -A (0: dump it all); what tcpdump prints after the line by itself (bytes it does not decode in hex,
    lines each starting with a newline), if anything; and its headers' fields by layer, as --json writes them
    (fcap.text.dissect.reader.PrintState's layers)."""

    text: str
    hdr: int
    more: str = ""
    layers: dict = {}


def dissect(data: bytes, linktype: int, orig_len: int, tcp_seqs: dict | None = None, eflag: bool = False,
            suppress: bool = False, verbose: int = 0, checksums: bool = True) -> Dissected:
    """A packet whose lengths describe() found valid, as tcpdump prints it; never raises on damaged packets.
    tcp_seqs: the table of tcpdump's relative TCP sequence numbers, kept across packets (None: absolute).
    eflag: print the link-level header (tcpdump -e). suppress: no hex of what is not decoded (-x, -X).
    verbose: tcpdump's -v count (IPv4's header fields on a line before the rest, checksums, an ICMP error's quoted
    packet as -v prints it); checksums=False: -v checks no IP, TCP or UDP checksum (tcpdump -K)."""
    p = PrintState(data if isinstance(data, bytes) else bytes(data), tcp_seqs, eflag, suppress, verbose, checksums)
    try:
        dissect_link(p, linktype, orig_len)
    except Truncated as e:
        if not e.said:
            p.add(f" [|{p.proto}]" + (e.args[0] if e.args else ""))
        if not e.soft:
            p.hdr = 0
    except (ValueError, IndexError, OverflowError, UnicodeError):  # a printer bug must not stop a capture
        p.add(f" [|{p.proto}: undecodable]")
        p.hdr = 0
    line, nl, more = "".join(p.out).partition("\n")
    return Dissected(line, p.hdr, nl + more, p.layers)
