"""What tcpdump decodes inside TCP options and ICMPv6 beyond the basics, compared with tcpdump -nn line by line at
every truncation: MPTCP (each subtype, valid and bad), TCP-MD5, TCP-AO, SCPS, user timeout, ICMPv6 node information,
router renumbering, RPL; and pcap timestamps of a second or more, or negative, as tcpdump prints them."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcap.text.show import Summarizer
from test_show import LO4, LO6, TCPDUMP, compare, eth, need_tcpdump

from scapy.all import IP, TCP, IPv6, Raw  # noqa: E402

SYN, SYNACK, ACK = "S", "SA", "A"


def tcp_with(options, flags=ACK, payload=b"", v6=False):
    ip = IPv6(src=LO6, dst="::2") if v6 else IP(src=LO4, dst="10.0.0.2")
    return eth(ip / TCP(sport=47000, dport=47001, flags=flags, seq=1000, ack=2000 if "A" in flags else 0,
                        options=options) / Raw(payload))


def mptcp(sub: int, low: int, rest: bytes = b"", flags=ACK, more=()):
    """A segment with one MPTCP option: subtype `sub`, the 4 bits after it `low`, then `rest`."""
    return tcp_with([(30, bytes([sub << 4 | low]) + rest), *more], flags)


KEY_A, KEY_B = bytes.fromhex("9c9eabd1e46a33b2"), bytes.fromhex("00000000000000ff")


def mptcp_packets():
    return [
        # MP_CAPABLE: SYN (4 or 12 bytes), third ACK (20, or 22 with data), versions, and lengths it refuses
        mptcp(0, 1, b"\x81", SYN), mptcp(0, 0, b"\x81" + KEY_A, SYN), mptcp(0, 1, b"\x01" + KEY_A, SYNACK),
        mptcp(0, 1, b"\x00" + KEY_A + KEY_B), mptcp(0, 1, b"\x80" + KEY_A + KEY_B + b"\x00\x10"),
        mptcp(0, 2, b"\x81", SYN), mptcp(0, 15, b"\x00" + KEY_A, SYN), mptcp(0, 1, b"\x81" + KEY_A),
        mptcp(0, 1, b"\x81\x00\x00", SYN), mptcp(0, 1, b"\x81" + KEY_A + KEY_B, SYN),
        # MP_JOIN: SYN, SYN/ACK, ACK; backup; the wrong flags
        mptcp(1, 0, b"\x05" + bytes(range(8)), SYN), mptcp(1, 1, b"\x00" + bytes(range(12)), SYNACK),
        mptcp(1, 0, b"\x00" + bytes(range(20))), mptcp(1, 0, b"\x05" + bytes(range(8))),
        mptcp(1, 0, b"\x00" + bytes(range(12)), SYN), mptcp(1, 0, b"\x00" + bytes(range(4)), SYN),
        # DSS: acks of 4 and 8 bytes, mappings of 4 and 8 with and without checksum, DATA_FIN, bad lengths, SYN
        mptcp(2, 0, b"\x01" + bytes.fromhex("d0bd7aef")), mptcp(2, 0, b"\x03" + KEY_A),
        mptcp(2, 0, b"\x05" + bytes.fromhex("c9dc1c61b1712fb60000000100019e91")),
        mptcp(2, 0, b"\x0f" + KEY_A + KEY_B + bytes.fromhex("000000010010")),
        mptcp(2, 0, b"\x1f" + KEY_A + KEY_B + bytes.fromhex("0000000000019999")),
        mptcp(2, 0, b"\x14" + bytes.fromhex("0000000100000002")), mptcp(2, 0, b"\x00"), mptcp(2, 0, b"\x10"),
        mptcp(2, 0, b"\x01\x00\x00"), mptcp(2, 0, b"\x03" + bytes(4)), mptcp(2, 0, b"\x04" + bytes(9)),
        mptcp(2, 0, b"\x01" + bytes(5)), mptcp(2, 0, b"\x01" + bytes(4), SYN), mptcp(2, 0, b""),
        mptcp(2, 0, b"\x0c" + bytes(8)), mptcp(2, 0, b"\x04" + bytes(4)),
        # ADD_ADDR: IPv4 and IPv6, with port and/or hmac; v0 and v1 versions, echo, an unknown one; bad lengths
        mptcp(3, 4, b"\x01" + bytes([10, 1, 2, 2])), mptcp(3, 0, b"\x02" + bytes([10, 1, 2, 2]) + b"\x1f\x90"),
        mptcp(3, 0, b"\x03" + bytes([192, 168, 1, 1]) + KEY_A),
        mptcp(3, 1, b"\x04" + bytes([192, 168, 1, 1]) + b"\x01\xbb" + KEY_A),
        mptcp(3, 6, b"\x05" + bytes(15) + b"\x01"), mptcp(3, 0, b"\x06" + bytes(15) + b"\x01" + b"\x00\x50"),
        mptcp(3, 0, b"\x07" + bytes(15) + b"\x01" + KEY_A), mptcp(3, 1, b"\x08" + bytes(16) + b"\x00\x50" + KEY_A),
        mptcp(3, 2, b"\x01" + bytes(4)), mptcp(3, 0, b"\x01" + bytes(5)),
        # REMOVE_ADDR, MP_PRIO, MP_FAIL, MP_FASTCLOSE, MP_TCPRST and later subtypes (4.99.3: "unknown")
        mptcp(4, 0, b"\x00"), mptcp(4, 0, b"\x01\x02\x03"), mptcp(4, 0, b""),
        mptcp(5, 1, b""), mptcp(5, 0, b"\x07"), mptcp(5, 1, b"\x07\x00"),
        mptcp(6, 0, b"\x00" + KEY_A), mptcp(6, 0, b"\x00" + KEY_A[:4]),
        mptcp(7, 0, b"\x00" + KEY_A), mptcp(7, 0, b"\x00" + KEY_A + b"\x00"),
        mptcp(8, 0, b"\x00"), mptcp(9, 3, b"abcdef"), mptcp(15, 15, b""),
        # with other options around it, and an option after it that does not fit
        mptcp(2, 0, b"\x01" + bytes(4), ACK, [("NOP", None), ("NOP", None), ("Timestamp", (5, 6))]),
        tcp_with([("NOP", None), (30, b"\x20\x01" + bytes(4)), (30, b"\x50")]),
        tcp_with([("Timestamp", (1, 2)), (30, b"\x00\x81" + KEY_A), (8, b"\x00")], SYN),
        tcp_with([(30, b"\x20\x01" + bytes(4))], v6=True),
    ]


def other_option_packets():
    signature = bytes(range(16))
    return [
        tcp_with([(19, signature), ("EOL", None)], payload=b"q" * 10),   # TCP-MD5: no -M secret to check it with
        tcp_with([("NOP", None), ("NOP", None), (19, signature)], v6=True), tcp_with([(19, signature[:8])]),
        tcp_with([(19, signature + b"xx")]),
        tcp_with([(29, b"")]), tcp_with([(29, b"\x05")]), tcp_with([(29, b"\x05\x06")]),   # TCP-AO
        tcp_with([(29, b"\x05\x06" + bytes(range(12)))]), tcp_with([("NOP", None), (29, b"\x30\x30" + b"0" * 6)]),
        tcp_with([(20, b"\x01\x02")]), tcp_with([(20, b"")]), tcp_with([(20, b"\x01\x02\x03")]),  # SCPS
        tcp_with([(28, b"\x01\x2d")]), tcp_with([(28, b"\x01\x2c")]), tcp_with([(28, b"")]),       # user timeout
        tcp_with([(28, b"\x80\x01\x02")]),
    ]


def icmp6(kind: int, code: int, body: bytes = b"", word: bytes = b"\0\0\0\0"):
    """An ICMPv6 message (no checksum: tcpdump checks it only with -v) after an IPv6 header."""
    return eth(IPv6(src="fe80::1", dst="fe80::2", nh=58) / Raw(bytes([kind, code, 0, 0]) + word + body))


NONCE = bytes(range(8))


def ni_query(code: int, qtype: int, flags: int = 0, subject: bytes = b""):
    return icmp6(139, code, NONCE + subject, struct.pack(">HH", qtype, flags))


def ni_reply(code: int, qtype: int, flags: int = 0, data: bytes = b""):
    return icmp6(140, code, NONCE + data, struct.pack(">HH", qtype, flags))


NAME = b"\x03www\x07example\x03com\x00"


def node_information_packets():
    v6 = bytes.fromhex("20010db8000000000000000000000001")
    return [
        icmp6(139, 0, b"\0\0\0\0"), icmp6(140, 0, b"\0\0\0\0"),          # KAME who-are-you (12 bytes)
        ni_query(0, 0), ni_query(0, 1, 1), ni_query(0, 1, 2), ni_query(0, 1, 0, v6), ni_query(0, 2),
        ni_query(0, 3, 0x3E, v6), ni_query(0, 3, 0x7F, v6[:10]), ni_query(2, 3, 0x02, b"\xc0\x00\x02\x01"),
        ni_query(2, 3, 0, b"\xc0\x00\x02\x01\x00"), ni_query(1, 2, 0, NAME), ni_query(1, 2, 0, NAME[:-1]),
        ni_query(1, 2, 0, NAME + b"\x00"), ni_query(1, 2, 0, b"\x05abcde"),
        ni_query(1, 2, 0, b"\x09ab\x01\x7f\x80\xff"),
        ni_query(1, 2, 0, b"\x03abc\x00\x01x"), ni_query(1, 2, 0, b"\x00"), ni_query(1, 2, 0, b"\x20ab"),
        ni_query(7, 4, 0, v6), ni_query(0, 9, 0, v6),
        ni_reply(0, 0), ni_reply(1, 0), ni_reply(2, 3, 0, b"x"), ni_reply(9, 3), ni_reply(0, 1, 1), ni_reply(0, 1, 0),
        ni_reply(0, 2, 1, b"\x00\x00\x0e\x10" + NAME), ni_reply(0, 2, 0, b"\x00\x00\x0e\x10\x05abcde"),
        ni_reply(0, 2, 0, b"\x00\x00\x00\x01"), ni_reply(0, 3, 0x03, (b"\x00\x00\x00\x05" + v6) * 2 + b"\x00\x01"),
        ni_reply(0, 3, 0), ni_reply(0, 4, 0, v6), ni_reply(0, 3, 0x40, b"\x00\x00\x00\x05" + v6),
    ]


def rr_match(code: int, uses: int, matchlen: int = 48, rpm_len: int | None = None) -> bytes:
    prefix = bytes.fromhex("fec00000000000000000000000000000")
    return bytes([code, 3 + 4 * uses if rpm_len is None else rpm_len, 0, matchlen, 0, 128, 0, 0]) + prefix


def rr_use(flags: int = 0, uselen: int = 48, keeplen: int = 16) -> bytes:
    prefix = bytes.fromhex("3ffe0501fffe00000000000000000000")
    return bytes([uselen, keeplen, 0, 0]) + b"\xff" * 8 + bytes([flags, 0, 0, 0]) + prefix


def router_renumbering_packets():
    head = bytes([0, 0x80, 0, 100, 0, 0, 0, 0])     # segment, flags, max delay, reserved
    seq = b"\x01\x00\x00\x00"
    return [
        icmp6(138, 0, head + rr_match(1, 1) + rr_use(), seq), icmp6(138, 0, head + rr_match(2, 2) + rr_use(0xC0)
                                                                     + rr_use(0x40, 64, 0)),
        icmp6(138, 0, head + rr_match(3, 0)), icmp6(138, 0, head + rr_match(9, 1) + rr_use(0x80)),
        icmp6(138, 0, head + rr_match(1, 1, rpm_len=5) + rr_use()), icmp6(138, 0, head + rr_match(1, 2) + rr_use()),
        icmp6(138, 0, head + rr_match(1, 0, rpm_len=1)), icmp6(138, 0, head), icmp6(138, 1, head, seq),
        icmp6(138, 255, head), icmp6(138, 7, head), icmp6(138, 0, head[:6]),
    ]


def rpl_packets():
    dio = bytes([1, 0, 0, 1]) + bytes(20)
    return [icmp6(155, code, dio) for code in (0, 1, 2, 3, 4, 0x7F, 0x80, 0x82)] + [icmp6(155, 2, b"")]


def cuts(packets, start: int = 54):
    """Each packet, then each of its truncations from `start` bytes on (the options and messages are past it)."""
    out = []
    for pkt in packets:
        data = bytes(pkt)
        out += [data] + [(data[:n], len(data)) for n in range(start, len(data))]
    return out


@need_tcpdump
@pytest.mark.parametrize("build", [mptcp_packets, other_option_packets])
def test_tcp_options_like_tcpdump(tmp_path, build):
    compare(tmp_path, 1, cuts(build(), 54))


@need_tcpdump
@pytest.mark.parametrize("build", [node_information_packets, router_renumbering_packets, rpl_packets])
def test_icmp6_messages_like_tcpdump(tmp_path, build):
    compare(tmp_path, 1, cuts(build(), 58))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_garbage_in_these_never_raises(data):
    """Damaged options and messages of these kinds: a line, never an exception nor the catch-all's text."""
    if not _BASES:
        _BASES.extend(bytes(p) for p in mptcp_packets()[::4] + other_option_packets()[::3]
                      + node_information_packets()[::5] + router_renumbering_packets()[:2] + rpl_packets()[:2])
    blob = bytearray(data.draw(st.sampled_from(_BASES)))
    for _ in range(data.draw(st.integers(1, 6))):
        blob[data.draw(st.integers(54, len(blob) - 1))] = data.draw(st.integers(0, 255))
    blob = blob[:data.draw(st.integers(54, len(blob)))]
    line = Summarizer()(0, bytes(blob), 1, len(blob) + data.draw(st.integers(0, 3)))
    assert isinstance(line, str) and "\n" not in line
    assert "undecodable" not in line


_BASES: list[bytes] = []


# ------------------------------------------------------------------------------------------ odd pcap timestamps

def odd_pcap(path: Path, nano: bool, stamps) -> None:
    """A pcap file (little-endian; nanosecond magic if nano) of one UDP packet per (sec, frac) as it is given."""
    data = bytes(eth(IP(src=LO4, dst=LO4, proto=17) / Raw(b"\x9c\x40\0\x09\0\x0c\0\0abcd")))
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D if nano else 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))
        for sec, frac in stamps:
            f.write(struct.pack("<IIII", sec, frac, len(data), len(data)) + data)


STAMPS = [(1418145369, None), (1418145370, 1), (1418145370, "one"), (1418145370, 2**31), (1418145370, 2**32 - 1),
          (1418145371, 5), (1418145372, "one"), (2**31 + 5, "one"), (1418145373, 3), (1418145373, 2**31 - 1)]


@need_tcpdump
@pytest.mark.parametrize("nano", [False, True])
@pytest.mark.parametrize("flags", [(), ("-tt",), ("--nano",), ("-tt", "--nano"), ("-tttt",), ("-ttt",),
                                   ("-ttttt",), ("-ttt", "--nano"), ("-ttttt", "--nano"), ("-t",)])
def test_odd_pcap_timestamps_like_tcpdump(tmp_path, nano, flags):
    """fcap -r prints a pcap record whose fraction of a second is a second or more as tcpdump 4.99 does (libpcap
    passes it on; the relative styles subtract it as it is; with the seconds' sign bit: "[Error converting time]")."""
    per_second = 10**9 if nano else 10**6
    path = tmp_path / "odd.pcap"
    odd_pcap(path, nano, [(sec, per_second - 1 if frac is None else per_second if frac == "one" else frac)
                          for sec, frac in STAMPS])
    theirs = subprocess.run([TCPDUMP, "-nn", *flags, "-r", str(path)], capture_output=True, text=True, timeout=60,
                            check=False)
    ours = subprocess.run([sys.executable, "-m", "fcap", "-nn", *flags, "-r", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert theirs.returncode == ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout
