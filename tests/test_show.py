"""Summaries compared line by line with tcpdump -nn; hex dumps with tcpdump -xx/-XX; scapy decode; damage."""

from __future__ import annotations

import functools
import io
import re
import shutil
import socket
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcap.text import show
from fcap.errors import PcapFormatError
from fcap.files.pcapfile import PcapWriter
from fcap.files.pcapread import read
from fcap.text.printer import PrintOptions, Printer
from fcap.text.show import Summarizer, describe, format_time, hexdump, scapy_decode, summary
from corpus import CAPTURES as CORPUS

scapy = pytest.importorskip("scapy.all", reason="scapy builds the test packets")
from scapy.all import (ARP, ICMP, IP, TCP, UDP, CookedLinux, CookedLinuxV2, Dot1Q, Ether,  # noqa: E402
                       ICMPv6DestUnreach, ICMPv6EchoReply, ICMPv6EchoRequest, ICMPv6MLQuery, ICMPv6MLReport,
                       ICMPv6MLReport2, ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6ND_RA, ICMPv6ND_RS, ICMPv6PacketTooBig,
                       ICMPv6TimeExceeded, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop,
                       IPv6ExtHdrRouting, Raw, RouterAlert)

TCPDUMP = shutil.which("tcpdump")
need_tcpdump = pytest.mark.skipif(TCPDUMP is None, reason="tcpdump is not installed")
T0 = 1_700_000_000_123_456_789
LO4, LO6 = "127.0.0.1", "::1"


def write_pcap(path: Path, linktype: int, packets) -> list[tuple[int, bytes, int]]:
    """packets: scapy packets, bytes, or (bytes, orig_len); written 1 ms apart. Returns (ts, data, orig_len)."""
    out = []
    with PcapWriter(open(path, "wb"), linktype, 262144) as w:
        for i, pkt in enumerate(packets):
            data, orig = pkt if isinstance(pkt, tuple) else (bytes(pkt), len(bytes(pkt)))
            w.write(T0 + i * 1_000_000, data, orig)
            out.append((T0 + i * 1_000_000, data, orig))
    return out


def tcpdump_lines(path: Path, *flags: str) -> list[str]:
    """The first line tcpdump prints for each packet (continuation lines start with a tab or spaces)."""
    p = subprocess.run([TCPDUMP, "-nn", *flags, "-r", str(path)], capture_output=True, text=True, errors="replace",
                       timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    return [line.rstrip() for line in p.stdout.splitlines() if line and not line.startswith(("\t", " "))]


_PACKET_NUMBER = re.compile(r"^ *(\d+)  ", re.MULTILINE)


def tcpdump_packets(path: Path, *flags: str) -> list[str]:
    """Everything tcpdump prints for each packet (its line, then any dump), told apart with -# (numbers)."""
    p = subprocess.run([TCPDUMP, "-nn", "-#", *flags, "-r", str(path)], capture_output=True, text=True,
                       errors="replace", timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    marks = list(_PACKET_NUMBER.finditer(p.stdout))
    ends = [m.start() for m in marks[1:]] + [len(p.stdout)]
    return [p.stdout[m.end():end] for m, end in zip(marks, ends)]


def printed_packets(recs, linktype: int, *flags: str) -> list[str]:
    """Everything fcap -r prints for each packet with the same flags (parsed by fcap's own parser)."""
    from fcap.commands.cli import _parser
    from fcap.commands.flagvalues import print_options
    args = _parser().parse_args([*flags, "-r", "-"])
    out = io.StringIO()
    printer = Printer(print_options(args), out)
    chunks = []
    for ts, data, orig in recs:
        out.seek(0)
        out.truncate()
        printer.packet(ts, data, linktype, orig)
        chunks.append(out.getvalue())
    return chunks


def compare_printed(tmp_path: Path, linktype: int, packets, *flags: str) -> None:
    """fcap's output for each packet with these flags is tcpdump's, line for line (dumps included)."""
    path = tmp_path / "p.pcap"
    recs = write_pcap(path, linktype, packets)
    theirs, ours = tcpdump_packets(path, *flags), printed_packets(recs, linktype, *flags)
    assert len(theirs) == len(ours)
    diffs = [f"#{i} {flags}\n  tcpdump: {t!r}\n  fcap:    {o!r}"
             for i, (t, o) in enumerate(zip(theirs, ours)) if t != o]
    assert not diffs, "\n".join(diffs[:10])


def compare(tmp_path: Path, linktype: int, packets, flags=("--nano", "-tt"), **summarizer) -> None:
    path = tmp_path / "x.pcap"
    recs = write_pcap(path, linktype, packets)
    theirs = tcpdump_lines(path, *flags)
    if "relative_seq" not in summarizer:
        summarizer["relative_seq"] = "-S" not in flags
    if "--nano" in flags:
        summarizer.setdefault("precision", "nano")
    if "-tt" in flags:
        summarizer.setdefault("time_style", "epoch")
    s = Summarizer(**summarizer)
    ours = [s(ts, data, linktype, orig).rstrip() for ts, data, orig in recs]
    assert len(theirs) == len(ours)
    diffs = [f"#{i}\n  tcpdump: {t}\n  fcap:    {o}" for i, (t, o) in enumerate(zip(theirs, ours)) if t != o]
    assert not diffs, "\n".join(diffs)


def eth(pkt, **kw):
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", **kw) / pkt


def cut(pkt, n):
    b = bytes(pkt)
    return b[:n], len(b)


def patched(pkt, offset, value: bytes):
    b = bytearray(bytes(pkt))
    b[offset:offset + len(value)] = value
    return bytes(b)


# ------------------------------------------------------------------------------------------ against tcpdump

UDP4 = IP(src=LO4, dst=LO4) / UDP(sport=40000, dport=9) / Raw(b"x" * 64)
SYN = IP(src=LO4, dst=LO4) / TCP(sport=45678, dport=80, flags="S", seq=123, window=65495,
                                  options=[("MSS", 65495), ("SAckOK", b""), ("Timestamp", (1, 0)), ("NOP", None),
                                           ("WScale", 7)])


def ipv4_packets():
    ip = IP(src=LO4, dst=LO4)
    return [
        UDP4, ip / UDP(sport=1000, dport=2000), IP(src="10.1.2.3", dst="192.0.2.1") / UDP(sport=7, dport=40001),
        SYN,
        ip / TCP(sport=45678, dport=80, flags="S", seq=123, window=65495),
        ip / TCP(sport=80, dport=45678, flags="SA", seq=1000, ack=124, window=65483),
        ip / TCP(sport=45678, dport=80, flags="A", seq=124, ack=1001, window=512),
        ip / TCP(sport=45678, dport=81, flags="PA", seq=124, ack=1001) / Raw(b"y" * 100),
        ip / TCP(sport=45678, dport=80, flags="FA", seq=224, ack=1001),
        ip / TCP(sport=45678, dport=80, flags="R", seq=225, window=0),
        ip / TCP(sport=45678, dport=80, flags="RA", seq=225),
        ip / TCP(sport=1, dport=2, flags="UAPRSFEC", seq=2**32 - 1, urgptr=3) / Raw(b"z"),
        ip / TCP(sport=1, dport=2, flags=0, options=[("SAck", (1, 2, 3, 4)), ("EOL", None)]),
        ip / TCP(sport=1, dport=2, flags="A", options=[("NOP", None), ("NOP", None), ("SAck", (5, 9))]),
        ip / TCP(sport=1, dport=2, options=[(99, b"\x01\x02"), (254, b"\xf9\x89"), (34, b"abcd")]),
        ip / ICMP(type=8, id=1, seq=1) / Raw(b"z" * 56), ip / ICMP(type=0, id=7, seq=9) / Raw(b"z" * 56),
        ip / ICMP(type=3, code=3) / IP(src=LO4, dst="10.9.9.9") / UDP(sport=1, dport=9),
        ip / ICMP(type=3, code=3) / IP(src=LO4, dst=LO4) / TCP(sport=1, dport=22),
        ip / ICMP(type=3, code=1) / IP(dst="10.1.1.1") / UDP(), ip / ICMP(type=3, code=0) / IP(dst="10.1.1.0") / UDP(),
        ip / ICMP(type=3, code=2) / IP() / UDP(), ip / ICMP(type=3, code=13) / IP() / UDP(),
        ip / ICMP(type=3, code=4, nexthopmtu=1400) / IP() / UDP(), ip / ICMP(type=3, code=9) / IP() / UDP(),
        ip / ICMP(type=11, code=0) / IP() / UDP(), ip / ICMP(type=11, code=1) / IP() / UDP(),
        ip / ICMP(type=5, code=1, gw="1.2.3.4") / IP() / UDP(), ip / ICMP(type=12, code=0, ptr=3) / IP() / UDP(),
        ip / ICMP(type=4) / IP() / UDP(), ip / ICMP(type=13, id=3, seq=4), ip / ICMP(type=17), ip / ICMP(type=10),
        ip / ICMP(type=99),
        IP(src="1.2.3.4", dst="5.6.7.8", proto=99) / Raw(b"a" * 20),
        IP(src="1.2.3.4", dst="5.6.7.8", flags="MF") / UDP(sport=1000, dport=2000) / Raw(b"a" * 20),
        IP(src="1.2.3.4", dst="5.6.7.8", frag=100, proto=17) / Raw(b"a" * 20),
        ip / IP(src="1.1.1.1", dst="2.2.2.2") / UDP(sport=5, dport=6),
        IP(src=LO4, dst=LO4, proto=41) / IPv6(src="::1", dst="::2") / UDP(sport=5, dport=6),
        IP(src=LO4, dst=LO4, proto=58) / Raw(b"\x80\0\0\0"),
        IP(src=LO4, dst=LO4, options=b"\x07\x07\x04\0\0\0\0\0") / UDP(sport=5, dport=6),
    ]


def ipv6_packets():
    ip6 = IPv6(src=LO6, dst=LO6)
    return [
        ip6 / UDP(sport=40000, dport=9) / Raw(b"x" * 12),
        IPv6(src="2001:db8::1", dst="fe80::1:2") / TCP(sport=1, dport=2, flags="S", seq=5),
        ip6 / ICMPv6EchoRequest(id=1, seq=2) / Raw(b"x" * 10), ip6 / ICMPv6EchoReply(id=1, seq=2),
        IPv6(src="fe80::1", dst="ff02::1:ff00:2") / ICMPv6ND_NS(tgt="fe80::2"),
        IPv6(src="fe80::2", dst="fe80::1") / ICMPv6ND_NA(tgt="fe80::2"),
        IPv6(src="fe80::2", dst="ff02::2") / ICMPv6ND_RS(), IPv6(src="fe80::2", dst="ff02::1") / ICMPv6ND_RA(),
        ip6 / ICMPv6DestUnreach(code=4) / IPv6(src=LO6, dst="2001:db8::9") / UDP(sport=1, dport=9),
        ip6 / ICMPv6DestUnreach(code=4) / IPv6(src=LO6, dst=LO6) / TCP(sport=1, dport=22),
        ip6 / ICMPv6DestUnreach(code=3) / IPv6(src=LO6, dst="2001:db8::7") / UDP(),
        ip6 / ICMPv6PacketTooBig(mtu=1280) / IPv6() / UDP(), ip6 / ICMPv6TimeExceeded(code=0) / IPv6(dst="::5") / UDP(),
        ip6 / ICMPv6TimeExceeded(code=1) / IPv6() / UDP(),
        IPv6(src="fe80::1", dst="ff02::16", hlim=1) / IPv6ExtHdrHopByHop(options=[RouterAlert()]) / ICMPv6MLReport2(),
        IPv6(src="fe80::1", dst="ff02::1") / IPv6ExtHdrHopByHop(options=[RouterAlert()]) / ICMPv6MLQuery(),
        IPv6(src="fe80::1", dst="ff02::fb") / IPv6ExtHdrHopByHop(options=[RouterAlert()]) / ICMPv6MLReport(
            mladdr="ff02::fb"),
        IPv6(src=LO6, dst=LO6, nh=59), ip6 / IPv6ExtHdrHopByHop() / UDP(sport=1, dport=2),
        ip6 / IPv6ExtHdrDestOpt() / UDP(sport=1, dport=2),
        ip6 / IPv6ExtHdrFragment(m=1, id=5) / UDP(sport=1, dport=2) / Raw(b"q" * 8),
        ip6 / IPv6ExtHdrFragment(offset=100, id=5, nh=17) / Raw(b"q" * 8),
        ip6 / IPv6ExtHdrRouting(addresses=["2001:db8::1", "2001:db8::2"], segleft=1) / UDP(sport=1, dport=2),
        IPv6(src=LO6, dst=LO6, nh=1) / Raw(b"\x08\0\0\0"),
    ]


def arp_packets():
    return [
        Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, psrc="10.0.0.2", pdst="10.0.0.1"),
        eth(ARP(op=2, psrc="10.0.0.1", pdst="10.0.0.2", hwsrc="00:11:22:33:44:55")),
        eth(ARP(op=1, psrc="10.0.0.2", pdst="10.0.0.1", hwdst="00:00:00:00:00:07")),
        eth(ARP(op=3, hwsrc="00:00:00:00:00:01", hwdst="00:00:00:00:00:02")),
        eth(ARP(op=4, hwdst="00:00:00:00:00:02", pdst="10.0.0.4")), eth(ARP(op=9, psrc="10.1.1.1")),
        eth(ARP(ptype=0x86DD)), eth(ARP(op=77)),
    ]


@need_tcpdump
def test_ethernet_ipv4(tmp_path):
    compare(tmp_path, 1, [eth(p) for p in ipv4_packets()])


@need_tcpdump
def test_ethernet_ipv6(tmp_path):
    compare(tmp_path, 1, [eth(p) for p in ipv6_packets()])


@need_tcpdump
def test_ethernet_arp_vlan_llc_and_unknown(tmp_path):
    compare(tmp_path, 1, arp_packets() + [
        eth(Dot1Q(vlan=100) / UDP4), eth(Dot1Q(vlan=5) / Dot1Q(vlan=6) / ARP()),
        eth(Raw(b"q" * 20), type=0x1234), eth(Raw(b"q" * 20), type=0x88B5),
        eth(Raw(b"\xaa\xaa\x03\0\0\0\x08\x00") / UDP4, type=8 + len(UDP4)),
        eth(IPv6(), type=0x0800), eth(Raw(b"\x45"), type=0x86DD), b"\x00" * 5,
    ])


@need_tcpdump
@pytest.mark.parametrize("linktype,wrap", [
    (101, lambda p: p), (228, lambda p: p), (229, lambda p: p),
    (0, lambda p: struct.pack("=I", 2 if p.version == 4 else 24) + bytes(p)),
    (108, lambda p: struct.pack(">I", 2 if p.version == 4 else 30) + bytes(p)),
    (113, lambda p: CookedLinux(pkttype=4, lladdrtype=1, lladdrlen=6, src=b"\x02\0\0\0\0\x01\0\0",
                                proto=0x800 if p.version == 4 else 0x86DD) / p),
    (276, lambda p: CookedLinuxV2(proto=0x800 if p.version == 4 else 0x86DD, ifindex=1, pkttype=0,
                                  lladdrtype=772, lladdrlen=6, src=b"\x02\0\0\0\0\x01\0\0") / p),
])
def test_other_linktypes(tmp_path, linktype, wrap):
    packets = [wrap(p) for p in ipv4_packets()[:12] + ipv6_packets()[:6]]
    compare(tmp_path, linktype, packets)


@need_tcpdump
def test_linktype_fallbacks(tmp_path):
    compare(tmp_path, 0, [struct.pack("=I", 10) + bytes(UDP4)])  # AF_INET6 of Linux is not a BSD family
    compare(tmp_path, 113, [CookedLinux(proto=0x1234) / Raw(b"abc"), CookedLinux(proto=4) / Raw(b"\xaa\xaa\x03")])
    compare(tmp_path, 276, [CookedLinuxV2(proto=0x9999, ifindex=1) / Raw(b"abc"),
                            CookedLinuxV2(proto=0x800, ifindex=0x7FFFFFF0) / UDP4])
    compare(tmp_path, 101, [b"\x55" + bytes(UDP4)[1:]])


def tcp_conversation():
    a, b = IP(src="10.0.0.1", dst="10.0.0.2"), IP(src="10.0.0.2", dst="10.0.0.1")
    isn_a, isn_b = 4_000_000_000, 77
    return [
        a / TCP(sport=50000, dport=8000, flags="S", seq=isn_a),
        b / TCP(sport=8000, dport=50000, flags="SA", seq=isn_b, ack=isn_a + 1,
                options=[("MSS", 1460), ("SAckOK", b""), ("WScale", 7)]),
        a / TCP(sport=50000, dport=8000, flags="A", seq=isn_a + 1, ack=isn_b + 1),
        a / TCP(sport=50000, dport=8000, flags="PA", seq=isn_a + 1, ack=isn_b + 1) / Raw(b"q" * 300),
        b / TCP(sport=8000, dport=50000, flags="A", seq=isn_b + 1, ack=(isn_a + 301) % 2**32,
                options=[("NOP", None), ("NOP", None), ("SAck", ((isn_a + 501) % 2**32, (isn_a + 601) % 2**32))]),
        b / TCP(sport=8000, dport=50000, flags="PA", seq=isn_b + 1, ack=(isn_a + 301) % 2**32) / Raw(b"r" * 7),
        a / TCP(sport=50000, dport=8000, flags="FA", seq=(isn_a + 301) % 2**32, ack=isn_b + 8),
        b / TCP(sport=8000, dport=50000, flags="FA", seq=isn_b + 8, ack=(isn_a + 302) % 2**32),
        a / TCP(sport=50000, dport=8000, flags="A", seq=(isn_a + 302) % 2**32, ack=isn_b + 9),
        IPv6(src="::2", dst="::1") / TCP(sport=9, dport=9, flags="A", seq=10, ack=20),  # same ports: by address
        IPv6(src="::1", dst="::2") / TCP(sport=9, dport=9, flags="A", seq=21, ack=11),
    ]


@need_tcpdump
def test_tcp_relative_and_absolute_sequence_numbers(tmp_path):
    packets = [eth(p) for p in tcp_conversation()]
    compare(tmp_path, 1, packets)  # relative, as tcpdump by default
    compare(tmp_path, 1, packets, flags=("--nano", "-tt", "-S"))
    path = tmp_path / "conv.pcap"
    recs = write_pcap(path, 1, packets)
    theirs = tcpdump_lines(path, "-S")  # summary() on its own packet: absolute, local time, microseconds
    assert [summary(ts, d, 1, n) for ts, d, n in recs] == theirs


@need_tcpdump
def test_timestamps_and_prefix(tmp_path):
    path = tmp_path / "t.pcap"
    recs = write_pcap(path, 1, [eth(UDP4)] * 3)
    for flags, kw in ((("-tt",), {"time_style": "epoch"}), (("-tttt",), {"time_style": "date"}),
                      (("-t",), {"time_style": "none"}), ((), {}), (("--nano",), {"precision": "nano"}),
                      (("--nano", "-tttt"), {"precision": "nano", "time_style": "date"})):
        s = Summarizer(**kw)
        assert [s(*r[:2], 1, r[2]) for r in recs] == tcpdump_lines(path, *flags), flags
    line = Summarizer()(T0, bytes(eth(UDP4)), 1, len(eth(UDP4)), prefix="[ip_output]")
    assert line == format_time(T0) + " [ip_output] IP 127.0.0.1.40000 > 127.0.0.1.9: UDP, length 64"


def test_format_time():
    assert format_time(1_500_000_123, "nano", "epoch") == "1.500000123"
    assert format_time(1_500_000_123, "micro", "epoch") == "1.500000"
    assert format_time(0, style="none") == ""
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.123456", format_time(T0))
    assert format_time(2**63 - 1, "nano").endswith(".854775807")


@need_tcpdump
def test_truncated_and_malformed_like_tcpdump(tmp_path):
    syn, udp = eth(SYN), eth(UDP4)
    icmp = eth(IP(src=LO4, dst=LO4) / ICMP(type=8, id=1, seq=1) / Raw(b"z" * 56))
    arp, v6 = arp_packets()[0], eth(ipv6_packets()[0])
    mld = eth(ipv6_packets()[14])
    packets = [cut(syn, n) for n in (10, 14, 20, 30, 34, 40, 50, 54, 60, 62, 70, 74)]
    packets += [cut(udp, n) for n in (36, 40, 42, 50)] + [cut(icmp, n) for n in (35, 38, 40, 42)]
    packets += [cut(arp, n) for n in (16, 20, 30, 41)] + [cut(v6, n) for n in (20, 54, 56, 60)]
    packets += [cut(mld, n) for n in (55, 60, 63, 70)]
    packets += [patched(udp, 14, b"\x44"), patched(udp, 14, b"\x55"), patched(udp, 14, b"\x65"),
                patched(udp, 16, b"\x00\x10"), patched(udp, 16, b"\x01\x10"), patched(udp, 38, b"\x00\x04"),
                patched(udp, 38, b"\x01\x04"), patched(syn, 46, b"\x30"), patched(syn, 46, b"\xf0"),
                patched(syn, 54, b"\x02\x01"), patched(syn, 54, b"\x02\x30"), patched(syn, 54, b"\x05\x04"),
                patched(syn, 54, b"\x08\x04"), patched(v6, 14, b"\x50"), patched(v6, 18, b"\x00\x00"),
                patched(v6, 18, b"\x01\x00"), patched(mld, 62, b"\x05\x03"), patched(mld, 62, b"\xc2\x04"),
                patched(mld, 60, b"\x3a\x01"), patched(mld, 20, b"\x00"), (bytes(udp), 10), (bytes(udp), 0),
                (bytes(udp), 300000)]
    compare(tmp_path, 1, packets)


_CORPUS_LINKTYPES = (0, 1, 101, 108, 113, 228, 229, 276)   # the link types fcap writes or reads as tcpdump
# Core lines: what tcpdump prints for IPv4/IPv6 with TCP, UDP, ICMP or ICMPv6 in them, and ARP, on those link types
# (options, extension headers, truncation and damage included); not the lines on which it went on to decode what
# TCP or UDP carries (anything after their length: DNS, BGP, ...), which fcap does not.
CORE_LINE = re.compile(r"^(IP6? \S+ > \S+: (Flags \[|UDP, |ICMP6?,? )|ARP, )")
PAST_TRANSPORT = re.compile(r"^IP6? \S+ > \S+: (Flags \[|UDP, ).*length \d+.")


@functools.lru_cache(maxsize=1)
def corpus_lines() -> tuple[tuple[str, str, str], ...]:
    """(capture, tcpdump's line, fcap's line) for every packet of tcpdump's captures of those link types which
    tcpdump -nn --nano -tt prints one line each for."""
    files = [f for f in sorted(CORPUS.iterdir()) if "macsec" not in f.name]

    def run(path: Path):
        try:
            recs = list(read(path))
        except PcapFormatError:
            return path, [], []
        if not recs or recs[0].linktype not in _CORPUS_LINKTYPES:
            return path, [], []
        return path, recs, tcpdump_lines(path, "--nano", "-tt")

    lines = []
    with ThreadPoolExecutor(4) as pool:
        for path, recs, theirs in pool.map(run, files):
            if len(theirs) != len(recs):
                continue
            s = Summarizer(precision="nano", time_style="epoch")
            lines += [(path.name, line, s(rec.ts_ns, rec.data, rec.linktype, rec.orig_len, stamp=rec.stamp).rstrip())
                      for rec, line in zip(recs, theirs)]
    return tuple(lines)


@need_tcpdump
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")
def test_corpus_lines_in_scope_match_tcpdump():
    """Over tcpdump's own captures: every line tcpdump prints for what this module decodes is the same here."""
    scope = re.compile(r"^(IP6? (\S+ > \S+: (UDP, (bad )?length \d+|Flags \[[^]]*\], [^:]*length \d+"
                       r"|ICMP6?,? [^:]*))|ARP, [^:]*)$")
    checked, diffs = 0, []
    for name, theirs, ours in corpus_lines():
        if scope.match(theirs.split(" ", 1)[-1]):
            checked += 1
            if ours != theirs:
                diffs.append(f"{name}\n  tcpdump: {theirs}\n  fcap:    {ours}")
    assert checked > 2500
    assert not diffs, "\n".join(diffs[:20])


@need_tcpdump
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")
def test_corpus_core_lines_identical_share():
    """Over tcpdump's own captures: at least 95% of the core lines (CORE_LINE) are tcpdump's, character for
    character; the count is printed (pytest -s) and the first differences shown when the share falls short."""
    core = [(name, theirs, ours) for name, theirs, ours in corpus_lines()
            if CORE_LINE.match(body := theirs.split(" ", 1)[-1]) and not PAST_TRANSPORT.match(body)]
    diffs = [f"{name}\n  tcpdump: {theirs}\n  fcap:    {ours}" for name, theirs, ours in core if ours != theirs]
    same = len(core) - len(diffs)
    print(f"\ncore lines identical to tcpdump's: {same} of {len(core)} ({same / len(core):.1%})")
    assert len(core) > 3000
    assert same >= 0.95 * len(core), "\n".join(diffs[:20])


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")
def test_corpus_never_raises():
    n = 0
    for path in sorted(CORPUS.iterdir()):
        try:
            recs = list(read(path))
        except PcapFormatError:
            continue
        s, v = Summarizer(), Summarizer(verbose=2)
        for rec in recs:
            assert isinstance(s(rec.ts_ns, rec.data, rec.linktype, rec.orig_len), str)
            shown = v.line(rec.ts_ns, rec.data, rec.linktype, rec.orig_len)
            assert "undecodable" not in shown.line + shown.more, (path.name, shown)
            n += 1
    assert n > 10000


_GARBAGE_BASES: list[bytes] = []


@settings(max_examples=400, deadline=None)
@given(linktype=st.sampled_from([0, 1, 101, 108, 113, 127, 228, 229, 276, 99999]), data=st.data())
def test_garbage_never_raises(linktype, data):
    if not _GARBAGE_BASES:  # scapy builds slowly: once
        _GARBAGE_BASES.extend([bytes(eth(p)) for p in ipv4_packets()[:4] + ipv6_packets()[14:18]] + [b""])
    base = data.draw(st.sampled_from(_GARBAGE_BASES))
    blob = bytearray(base if linktype == 1 else base[14:])
    for _ in range(data.draw(st.integers(0, 6))):
        if blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    blob = blob[:data.draw(st.integers(0, len(blob)))] + data.draw(st.binary(max_size=8))
    orig = len(blob) + data.draw(st.integers(0, 3))
    line = Summarizer()(0, bytes(blob), linktype, orig)
    assert isinstance(line, str) and "\n" not in line
    assert "undecodable" not in line  # the catch-all in describe() is for bugs; garbage is not one
    verbose = Summarizer(verbose=2).line(0, bytes(blob), linktype, orig)   # (-vv: options, checksums, quotes)
    assert "undecodable" not in verbose.line + verbose.more


def test_describe_examples():
    # out of scope: protocols tcpdump decodes and this module does not get one plain line
    assert describe(bytes(eth(Raw(b"\x42\x42\x03" + b"\0" * 40), type=46)), 1, 60).endswith(
        "802.3, length 46: LLC, dsap 0x42, ssap 0x42")
    assert describe(bytes(eth(Raw(b"x" * 20), type=0x88CC)), 1, 34).endswith("ethertype LLDP (0x88cc), length 34: ")
    assert describe(bytes(IP(proto=47) / Raw(b"\0" * 8)), 101, 28).endswith(":  ip-proto-47 8")
    assert describe(bytes(eth(UDP4)), 1, 106) == "IP 127.0.0.1.40000 > 127.0.0.1.9: UDP, length 64"
    assert describe(bytes(UDP4), 101, 92) == describe(bytes(UDP4), 228, 92)
    assert describe(b"\x01\x02", 147, 2) == "unknown linktype 147, length 2"
    assert describe(b"\x01\x02", 127, 2) == "linktype IEEE802_11_RADIO (127), length 2"
    assert describe(memoryview(bytes(eth(UDP4))), 1, 106).endswith("UDP, length 64")


# ------------------------------------------------------------------------------------------ hex dumps, scapy

@need_tcpdump
@pytest.mark.parametrize("ascii_", [False, True])
def test_hexdump_like_tcpdump(tmp_path, ascii_):
    packets = [eth(UDP4), cut(eth(UDP4), 15), cut(eth(UDP4), 16), cut(eth(UDP4), 17), cut(eth(UDP4), 33),
               eth(IP(src=LO4, dst=LO4) / UDP(sport=1, dport=2) / Raw(bytes(range(256))))]
    path = tmp_path / "x.pcap"
    recs = write_pcap(path, 1, packets)
    p = subprocess.run([TCPDUMP, "-nn", "-XX" if ascii_ else "-xx", "-r", str(path)], capture_output=True,
                       text=True, timeout=60, check=False)
    dumps = re.split(r"^\S.*\n", p.stdout, flags=re.MULTILINE)[1:]
    assert [hexdump(data, ascii_) for _, data, _ in recs] == [d.rstrip("\n") for d in dumps]


def test_hexdump_format():
    assert hexdump(b"") == ""
    assert hexdump(b"E\x00\x00T\x01") == "\t0x0000:  4500 0054 01"
    assert hexdump(b"E\x00 T", True) == "\t0x0000:  4500 2054" + " " * 30 + "  E..T"  # a space is not graphic


def test_scapy_decode():
    text = scapy_decode(bytes(eth(UDP4)), 1)
    assert "###[ Ethernet ]###" in text and "###[ UDP ]###" in text and "dport" in text
    assert "###[ IPv6 ]###" in scapy_decode(bytes(ipv6_packets()[0]), 101)
    assert "###[ IP ]###" in scapy_decode(bytes(UDP4), 101)
    assert "###[ Raw ]###" in scapy_decode(b"abc", 99999)
    assert "cooked" in scapy_decode(bytes(CookedLinuxV2(proto=0x800) / UDP4), 276).lower()


def test_scapy_decode_of_cut_packets_never_raises(capsys):
    """scapy's dissectors raise on many cut packets (struct.error, IndexError): the decode says so in one line
    and shows the bytes; scapy's own warnings are not printed."""
    for blob, linktype, cls in ((b"\x02", 1, "Ether"), (b"\x30", 229, "IPv6"), (b"\x45\x00", 101, "IP")):
        text = scapy_decode(blob, linktype)
        assert text.startswith(f"  (scapy cannot decode this as {cls}: error: ") and "###[ Raw ]###" in text, text
    assert "###[ IP ]###" in scapy_decode(bytes(eth(SYN))[:40], 1)
    assert capsys.readouterr().err == ""


def test_scapy_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "scapy", None)
    monkeypatch.setitem(sys.modules, "scapy.all", None)
    with pytest.raises(show.ScapyMissing, match="pip install") as info:
        scapy_decode(b"abc", 1)
    assert isinstance(info.value, ImportError)


def test_sll2_names_the_interface():
    pkt = bytes(CookedLinuxV2(proto=0x800, ifindex=1, pkttype=4) / UDP4)
    name = socket.if_indextoname(1)
    assert describe(pkt, 276, len(pkt)).startswith(f"{name:<5} Out IP 127.0.0.1.40000 > 127.0.0.1.9")


def test_no_printing(capsys):
    Summarizer()(0, bytes(eth(UDP4)), 1, 106)
    hexdump(b"abc", True)
    assert capsys.readouterr() == ("", "")


# ------------------------------------------------------------------------------------------ the command line's printer

def printed(packets, point=None, **args) -> list[str]:
    """Printer's lines for Ethernet (ts, data, orig_len) packets; args as the command line sets them."""
    out = io.StringIO()
    printer = Printer(PrintOptions(**args), out)
    for ts, data, orig in packets:
        printer.packet(ts, data, 1, orig, point)
    return out.getvalue().splitlines()


def test_printer_puts_the_point_after_the_timestamp():
    udp = bytes(eth(UDP4))
    lines = printed([(T0, udp, len(udp)), (T0, udp, 0), (T0, udp, len(udp) - 1)], "tp_btf/net_dev_queue")
    assert lines == [f"{format_time(T0)} tp_btf/net_dev_queue IP 127.0.0.1.40000 > 127.0.0.1.9: UDP, length 64",
                     "tp_btf/net_dev_queue [Invalid header: len==0]",  # tcpdump's text whole, without a timestamp
                     "tp_btf/net_dev_queue [Invalid header: len(105) < caplen(106)]"]
    assert printed([(T0, udp, 0)]) == ["[Invalid header: len==0]"]
    assert printed([(T0, udp, len(udp))], nano=True) == [summary(T0, udp, 1, len(udp), precision="nano")]


def test_printer_says_once_that_scapy_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "scapy", None)
    monkeypatch.setitem(sys.modules, "scapy.all", None)
    udp = bytes(eth(UDP4))
    lines = printed([(T0 + i, udp, len(udp)) for i in range(3)], decode=True)
    assert len(lines) == 4 and sum("pip install 'fcap[decode]'" in line for line in lines) == 1, lines
    assert lines[1].startswith("  (decoding with scapy needs scapy")


def test_printer_hex_and_decode():
    udp = bytes(eth(UDP4))
    assert printed([(T0, udp, len(udp))], hex=1)[1:] == hexdump(udp[14:]).splitlines()   # -x: past the link header
    assert printed([(T0, udp, len(udp))], hex=2)[1:] == hexdump(udp).splitlines()        # -xx: all of it
    assert printed([(T0, udp, len(udp))], hexascii=1)[1:] == hexdump(udp[14:], True).splitlines()
    assert printed([(T0, udp, len(udp))], hexascii=1, hex=1, ascii=1) == printed([(T0, udp, len(udp))], hexascii=1)
    text = "\n".join(printed([(T0, udp, len(udp))] * 2, decode=True))
    assert text.count("###[ Ethernet ]###") == 2
