"""tcpdump's printing flags, each compared with tcpdump's output on the same packets (dumps included): -e, -x/-X
past the link-level header as tcpdump counts it at every truncation of each link type, -A, -t..-ttttt, -S, -K,
--count, -c, -l; over tcpdump's own captures too."""

from __future__ import annotations

import io
import re
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fcap.text import show
from fcap.errors import PcapFormatError
from fcap.files.pcapfile import PcapWriter
from fcap.files.pcapread import read
from fcap.text.printer import PrintOptions, Printer
from test_show import (CORPUS, LO4, LO6, SYN, T0, TCPDUMP, UDP4, arp_packets, compare_printed, eth, ipv4_packets,
                       ipv6_packets, need_tcpdump, printed_packets, tcp_conversation, tcpdump_packets, write_pcap)

from scapy.all import (ARP, ICMP, IP, TCP, UDP, CookedLinux, CookedLinuxV2, Dot1Q, ICMPv6DestUnreach,  # noqa: E402
                       ICMPv6EchoReply, ICMPv6EchoRequest, IPOption_LSRR, IPOption_Router_Alert, IPOption_RR,
                       IPOption_Timestamp, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop,
                       IPv6ExtHdrRouting, PadN, Raw, RouterAlert)


# ------------------------------------------------------------------------------------------ tcpdump's flags

def link_wrapped(linktype: int, pkt) -> bytes:
    """An IPv4 or IPv6 scapy packet behind the link-level header of `linktype`."""
    v4 = pkt.version == 4
    return bytes({
        1: lambda: eth(pkt),
        113: lambda: CookedLinux(pkttype=4, lladdrtype=1, lladdrlen=6, src=b"\x02\0\0\0\0\x01\0\0",
                                 proto=0x800 if v4 else 0x86DD) / pkt,
        276: lambda: CookedLinuxV2(proto=0x800 if v4 else 0x86DD, ifindex=1, pkttype=0, lladdrtype=772,
                                   lladdrlen=6, src=b"\x02\0\0\0\0\x01\0\0") / pkt,
        0: lambda: struct.pack("=I", 2 if v4 else 24) + bytes(pkt),
        108: lambda: struct.pack(">I", 2 if v4 else 30) + bytes(pkt),
        101: lambda: pkt, 228: lambda: pkt, 229: lambda: pkt,
    }[linktype]())


def cut_bases():
    """Packets whose every prefix meets a different truncation check of tcpdump's printers."""
    ip = IP(src=LO4, dst=LO4)
    return [SYN, UDP4, ip / ICMP(type=8, id=1, seq=1) / Raw(b"z" * 8),
            ip / ICMP(type=3, code=3) / IP(src=LO4, dst="10.9.9.9") / UDP(sport=1, dport=9),
            ip / ICMP(type=11) / IP(src=LO4, dst="10.9.9.9") / UDP(sport=1, dport=9),
            ip / TCP(sport=1, dport=2, flags="PA", seq=5, ack=9, options=[("NOP", None), ("NOP", None),
                                                                         ("SAck", (5, 9))]) / Raw(b"abc"),
            IPv6(src=LO6, dst=LO6) / UDP(sport=40000, dport=9) / Raw(b"x" * 4), ipv6_packets()[14],
            IPv6(src=LO6, dst=LO6) / ICMPv6EchoRequest(id=1, seq=2), ipv6_packets()[4],
            IPv6(src=LO6, dst=LO6) / ICMPv6DestUnreach(code=4) / IPv6(src=LO6, dst=LO6) / TCP(sport=1, dport=22),
            IPv6(src=LO6, dst=LO6) / IPv6ExtHdrFragment(m=1, id=5) / UDP(sport=1, dport=2) / Raw(b"q" * 8),
            IPv6(src=LO6, dst=LO6) / IPv6ExtHdrRouting(addresses=["2001:db8::1"], segleft=1) / TCP(sport=1, dport=2),
            IPv6(src=LO6, dst=LO6) / TCP(sport=1, dport=2, flags="S", seq=5, options=[("MSS", 1460), ("WScale", 7)])]


def every_prefix(packets) -> list[tuple[bytes, int]]:
    return [(bytes(b)[:n], len(bytes(b))) for b in packets for n in range(1, len(bytes(b)) + 1)]


@need_tcpdump
@pytest.mark.parametrize("linktype", [1, 113, 276, 0, 101])
def test_dumps_and_link_headers_of_every_truncation_like_tcpdump(tmp_path, linktype):
    """Each packet cut at every length: -x dumps what follows the link-level header as tcpdump counts it (the
    whole packet where tcpdump's printers give up by jumping out of them all), and -e prints that header."""
    packets = [link_wrapped(linktype, p) for p in cut_bases()]
    if linktype == 1:
        packets += [bytes(arp_packets()[0]), bytes(eth(Dot1Q(vlan=5) / UDP4)),
                    bytes(eth(Raw(b"\xaa\xaa\x03\0\0\0\x08\x00") / UDP4, type=8 + len(UDP4)))]
    if linktype == 276:
        packets.append(bytes(CookedLinuxV2(proto=0x8100, ifindex=1) / Dot1Q(vlan=3) / UDP4))
    packets = every_prefix(packets)
    compare_printed(tmp_path, linktype, packets, "-x")
    compare_printed(tmp_path, linktype, packets, "-e")
    compare_printed(tmp_path, linktype, packets, "-vv", "-x")


@need_tcpdump
@pytest.mark.parametrize("linktype", [1, 113, 276, 0, 108, 101, 228, 229])
def test_link_headers_like_tcpdump(tmp_path, linktype):
    """-e over whole packets of every kind this printer decodes."""
    packets = ipv4_packets() + ipv6_packets()
    if linktype in (228, 229):
        packets = [p for p in packets if p.version == (4 if linktype == 228 else 6)]
    packets = [link_wrapped(linktype, p) for p in packets]
    if linktype == 1:
        packets += [bytes(p) for p in arp_packets()] + [
            bytes(eth(Dot1Q(vlan=100, prio=5, id=1) / UDP4)), bytes(eth(Dot1Q(vlan=5) / Dot1Q(vlan=6) / ARP())),
            bytes(eth(Raw(b"q" * 20), type=0x1234)),
            bytes(eth(Raw(b"\xaa\xaa\x03\0\0\0\x08\x00") / UDP4, type=8 + len(UDP4))),
            bytes(eth(Raw(b"\xaa\xaa\x03\0\0\0\x12\x34") / UDP4, type=8 + len(UDP4)))]
    if linktype in (113, 276):
        cls = CookedLinux if linktype == 113 else CookedLinuxV2
        packets += [bytes(cls(proto=0x1234) / Raw(b"abc")), bytes(cls(proto=0x8100) / Dot1Q(vlan=3) / UDP4),
                    bytes(cls(proto=0x806) / ARP())]
    compare_printed(tmp_path, linktype, packets, "-e")
    compare_printed(tmp_path, linktype, packets, "-e", "-X")


@need_tcpdump
@pytest.mark.parametrize("linktype", [1, 276, 101])
def test_ascii_like_tcpdump(tmp_path, linktype):
    """-A and -AA: printable bytes, tabs, spaces and newlines as they are, "." for the rest, carriage returns
    left out before a newline and among the last two bytes."""
    payloads = [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"a\rb\rcd", b"x\r", b"xy\r", b"\r\n", b"\r",
                b"tab\there", bytes(range(256)), b"\r\r\n\n\r", b""]
    ip = IP(src=LO4, dst=LO4)
    packets = [link_wrapped(linktype, ip / UDP(sport=1, dport=2) / Raw(p)) for p in payloads]
    packets += [link_wrapped(linktype, ip / TCP(sport=45678, dport=45679, flags="PA") / Raw(p)) for p in payloads[:3]]
    for flags in (("-A",), ("-AA",), ("-A", "-e")):
        compare_printed(tmp_path, linktype, packets, *flags)


def test_asciidump():
    assert show.asciidump(b"a\r\nb") == "a\nb"
    assert show.asciidump(b"a\rbc") == "a.bc"
    assert show.asciidump(b"ab\rc") == "abc"        # one byte left after it: tcpdump drops the CR
    assert show.asciidump(b"\x00\x7f\x80 \t") == "... \t"


@need_tcpdump
def test_time_styles_like_tcpdump(tmp_path):
    """-t, -tt, -ttt (since the packet before, signed), -tttt, -ttttt (since the first), in micro- and
    nanoseconds, over times that go back, jump days and start at zero."""
    path = tmp_path / "t.pcap"
    udp = bytes(eth(UDP4))
    times = [0, T0, T0 + 1_500, T0 + 1_500_000_000, T0 + 2 * 86400 * 10**9 + 7, T0 - 3 * 10**9 - 999,
             T0 - 3 * 10**9, T0 + 10**9 * 3600 * 25]
    with PcapWriter(open(path, "wb"), 1) as w:
        for t in times:
            w.write(t, udp, len(udp))
    recs = [(t, udp, len(udp)) for t in times]
    for t in ("-t", "-tt", "-ttt", "-tttt", "-ttttt"):
        for flags in ((t,), (t, "--nano")):
            assert printed_packets(recs, 1, *flags) == tcpdump_packets(path, *flags), flags


@need_tcpdump
def test_sequence_numbers_and_checksum_flag_like_tcpdump(tmp_path):
    """fcap -r prints tcpdump's relative sequence numbers, -S absolute ones; -K (fcap never verifies checksums,
    tcpdump does only with -v) changes nothing."""
    packets = [eth(p) for p in tcp_conversation()]
    for flags in ((), ("-S",), ("-K",), ("-S", "-K", "-e")):
        compare_printed(tmp_path, 1, packets, *flags)


_IN_SCOPE = re.compile(r"^(IP6? (\S+ > \S+: (UDP, (bad )?length \d+|Flags \[[^]]*\], [^:]*length \d+"
                       r"|ICMP6?,? [^:]*))|ARP, [^:]*)$")


@need_tcpdump
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")
@pytest.mark.parametrize("flags", [("-e", "-X"), ("-A", "-ttt"), ("-v",), ("-vv", "-e", "-x"), ("-v", "-K")])
def test_corpus_with_flags_like_tcpdump(flags):
    """Over tcpdump's own captures, every packet whose line this printer decodes: everything printed with these
    flags (the link-level header, the dumps, the times since the packet before, -v's header fields, checksums
    and quoted packets) is tcpdump's."""
    out_of_scope = re.compile(r"mptcp|md5|tcp-ao|node information|RPL|mobile router")
    files = [f for f in sorted(CORPUS.iterdir()) if not re.search(r"macsec|timestamp_invalid", f.name)]

    def run(path: Path):
        try:
            recs = [(r.ts_ns, r.data, r.orig_len, r.linktype) for r in read(path)]
        except PcapFormatError:
            return path, [], [], []
        if not recs or recs[0][3] not in (0, 1, 101, 108, 113, 228, 229, 276):
            return path, [], [], []
        return path, recs, tcpdump_packets(path, "--nano", "-tt"), tcpdump_packets(path, "--nano", *flags)

    checked, diffs = 0, []
    with ThreadPoolExecutor(4) as pool:
        for path, recs, plain, theirs in pool.map(run, files):
            if not recs or len(theirs) != len(recs) or len(plain) != len(recs):
                continue
            ours = printed_packets([r[:3] for r in recs], recs[0][3], "--nano", *flags)
            for i, (line, t, o) in enumerate(zip(plain, theirs, ours)):
                body = line.split("\n", 1)[0].split(" ", 1)[-1]
                if _IN_SCOPE.match(body) and not out_of_scope.search(body) and _quotes_in_scope(t):
                    checked += 1
                    if t != o:
                        diffs.append(f"{path.name} #{i + 1}\n  tcpdump: {t!r}\n  fcap:    {o!r}")
    assert checked > 2500
    assert not diffs, "\n".join(diffs[:10])


def verbose_packets() -> list[bytes]:
    """What tcpdump -v shows more of: the IP headers' fields (ECN, DF and MF, a fragment's offset, options of
    either version), checksums right and wrong (over a source route's final destination too), a reset's text, an
    ICMP error's quoted packet and its MPLS extension."""
    ip = IP(src=LO4, dst="10.9.9.9", tos=0x13, id=77, flags="DF", ttl=9)
    bad = {"chksum": 0x1234}
    mpls = bytes.fromhex("20000000") + struct.pack(">HBB", 8, 1, 1) + struct.pack(">I", 16005 << 12 | 0x1FF)
    mpls = mpls[:2] + struct.pack(">H", ~sum(struct.unpack(">6H", mpls)) % 0xFFFF) + mpls[4:]
    quoted = bytes(IP(src="10.9.9.9", dst=LO4, ttl=1) / UDP(sport=4000, dport=33434) / Raw(b"t" * 100))[:128]
    packets = [
        ip / TCP(sport=1, dport=2, flags="S", seq=9), ip / TCP(sport=1, dport=2, flags="S", seq=9, **bad),
        ip / TCP(sport=1, dport=2, flags="RA", seq=9, ack=3) / Raw(b"reset: no such\x01\xff port, and more than 30"),
        ip / UDP(sport=1, dport=2) / Raw(b"x" * 5), ip / UDP(sport=1, dport=2, **bad) / Raw(b"x" * 5),
        ip / UDP(sport=1, dport=2, chksum=0), IP(src=LO4, dst=LO4, **bad) / UDP(sport=1, dport=2),
        IP(src=LO4, dst=LO4, flags="MF", frag=0) / UDP(sport=1, dport=2) / Raw(b"y" * 16),
        IP(src=LO4, dst=LO4, frag=3, proto=17) / Raw(b"y" * 16), IP(src=LO4, dst=LO4, tos=3, ttl=0) / ICMP(),
        IP(src=LO4, dst=LO4) / ICMP(**bad),
        IP(src=LO4, dst=LO4, options=[IPOption_RR(routers=["1.2.3.4"] * 2)]) / ICMP(),
        IP(src=LO4, dst=LO4, options=[IPOption_LSRR(routers=["1.2.3.4", "5.6.7.8"], pointer=4)])
        / TCP(sport=1, dport=2),
        IP(src=LO4, dst=LO4, options=[IPOption_Timestamp(flg=1, timestamp=5, internet_address="1.1.1.1",
                                                         length=12, pointer=5), IPOption_Router_Alert()]) / ICMP(),
        IP(src=LO4, dst=LO4) / ICMP(type=3, code=3) / IP(src=LO4, dst="10.9.9.9", **bad) / TCP(sport=5, dport=6),
        IP(src=LO4, dst=LO4) / ICMP(type=11, code=0, length=32) / Raw(quoted + mpls),
        IPv6(src=LO6, dst=LO6, tc=0x22, fl=0x12345) / TCP(sport=1, dport=2, flags="S"),
        IPv6(src=LO6, dst=LO6) / UDP(sport=1, dport=2, **bad) / Raw(b"z"),
        IPv6(src=LO6, dst=LO6) / IPv6ExtHdrRouting(addresses=["2001:db8::1"], segleft=1) / UDP(sport=1, dport=2),
        IPv6(src=LO6, dst=LO6) / IPv6ExtHdrHopByHop(options=[RouterAlert(), PadN(optdata=b"\0\0")])
        / ICMPv6EchoRequest(id=3, seq=4),
        IPv6(src=LO6, dst=LO6) / IPv6ExtHdrDestOpt(options=[PadN(optdata=b"\0" * 4)]) / ICMPv6EchoReply(**{"cksum": 7}),
        IPv6(src=LO6, dst=LO6) / IPv6ExtHdrFragment(m=1, id=0x1234) / UDP(sport=1, dport=2) / Raw(b"q" * 8),
    ]
    return [bytes(eth(p)) for p in packets] + [bytes(p) for p in arp_packets()]


@need_tcpdump
@pytest.mark.parametrize("flags", [("-v",), ("-vv",), ("-v", "-K"), ("-vvv", "-e", "-X")])
def test_verbose_like_tcpdump(tmp_path, flags):
    """tcpdump's -v (-vv, -K): each kind of packet it shows more of, and every truncation of them, printed as
    tcpdump prints it."""
    packets = verbose_packets()
    compare_printed(tmp_path, 1, packets, *flags)
    compare_printed(tmp_path, 1, every_prefix(packets[:3] + packets[13:16] + packets[20:21]), *flags)


def test_checksums():
    """The one's complement sum (by the remainder modulo 0xFFFF) against the word-by-word one, RFC 1071's example,
    and tcpdump's "should be" value."""
    from fcap.text.dissect.cksum import in_cksum, ones_sum, shouldbe

    def by_words(data: bytes) -> int:
        data += b"\0" * (len(data) % 2)
        s = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
        while s >> 16:
            s = (s & 0xFFFF) + (s >> 16)
        return s
    assert ones_sum(bytes.fromhex("0001f203f4f5f6f7")) == 0xDDF2   # RFC 1071, 3.
    for data in (b"", b"\0\0", b"\xff\xff", b"\xff\xff\xff\xff", b"\x01", bytes(range(256)) * 3, b"\xff\xfe\x00\x01"):
        assert ones_sum(data) == by_words(data), data
    header = bytes(IP(src=LO4, dst="10.9.9.9"))[:20]
    assert in_cksum(header) == 0
    broken = header[:10] + b"\x12\x34" + header[12:]
    assert shouldbe(0x1234, in_cksum(broken)) == int.from_bytes(header[10:12], "big")


def _quotes_in_scope(text: str) -> bool:
    """Whether the packet an ICMP error quotes, as tcpdump -v prints it, is one this printer decodes (not DNS...)."""
    quoted = re.search(r"\n\t(?:IP )?\(.*\)\n    (.*)", text)
    return not quoted or bool(_IN_SCOPE.match("IP " + quoted.group(1)))


@need_tcpdump
def test_read_with_flags_is_tcpdump_output_and_count(tmp_path):
    """The command itself: fcap -r FILE with tcpdump's flags prints what tcpdump prints; --count prints
    "N packets" ("1 packet") as tcpdump --count does, with -c too."""
    path = tmp_path / "c.pcap"
    write_pcap(path, 1, [eth(p) for p in tcp_conversation()[:5]])
    for flags in (["-e", "-x", "-c", "3"], ["-A", "-S", "-ttttt"], ["--count"], ["--count", "-c", "1"]):
        ours = subprocess.run([sys.executable, "-m", "fcap.commands.cli", "-r", str(path), *flags], capture_output=True,
                              text=True, timeout=60, check=False)
        theirs = subprocess.run([TCPDUMP, "-nn", "-r", str(path), *flags], capture_output=True, text=True,
                                timeout=60, check=False)
        assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout), flags
        assert ours.stderr == "", ours.stderr


def test_printer_line_buffered_flushes_each_packet():
    class Stream(io.StringIO):
        flushes = 0

        def flush(self):
            Stream.flushes += 1
            super().flush()
    udp = bytes(eth(UDP4))
    out = Stream()
    printer = Printer(PrintOptions(line_buffered=True), out)
    for i in range(3):
        printer.packet(T0 + i, udp, 1, len(udp))
        assert Stream.flushes == i + 1 and out.getvalue().count("\n") == i + 1
    quiet = Printer(PrintOptions(count_only=True), out)
    quiet.packet(T0, udp, 1, len(udp))
    assert quiet.counted == 1 and out.getvalue().count("\n") == 3 and quiet.count_line() == "1 packet\n"
