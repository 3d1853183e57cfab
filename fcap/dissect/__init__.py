"""Protocol printers: what tcpdump -nn prints after the timestamp, from the link layer to TCP/UDP/ICMP/ARP.

Layers, each importing only those below it: reader (the packet and its bounds-checked reads), transport (TCP,
UDP) and icmp (ICMP, ICMPv6), ip (IPv4, IPv6 and its extension headers, the demux to what they carry), link
(Ethernet, cooked, loopback, raw IP, ARP). dissect() below is the one entry point.
"""

from __future__ import annotations

from fcap.dissect.link import dissect_link
from fcap.dissect.reader import Packet, Truncated

__all__ = ["dissect"]


def dissect(data: bytes, linktype: int, orig_len: int, tcp_seqs: dict | None = None) -> str:
    """The text for a packet whose lengths describe() found valid; never raises on damaged packets.
    tcp_seqs: the table of tcpdump's relative TCP sequence numbers, kept across packets (None: absolute)."""
    p = Packet(data if isinstance(data, bytes) else bytes(data), tcp_seqs)
    try:
        dissect_link(p, linktype, orig_len)
    except Truncated as e:
        p.add(f" [|{p.proto}]" + (e.args[0] if e.args else ""))
    except (ValueError, IndexError, OverflowError, UnicodeError):  # a printer bug must not stop a capture
        p.add(f" [|{p.proto}: undecodable]")
    return "".join(p.out)
