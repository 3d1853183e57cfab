"""pcap/pcapng writers and readers: round trips, independent readers (tshark, tcpdump, dpkt, scapy), damage."""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fcap.files import linktypes
from fcap.errors import FcapError, PcapFormatError
from fcap.files.pcapfile import FLAG_INBOUND, FLAG_OUTBOUND, PcapngWriter, PcapWriter, format_for_path, open_writer
from fcap.files.pcapread import FileRecord, read
from corpus import CAPTURES as CORPUS

TSHARK = shutil.which("tshark")
TCPDUMP = shutil.which("tcpdump")
need_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
need_tcpdump = pytest.mark.skipif(TCPDUMP is None, reason="tcpdump is not installed")
NS = 1_000_000_000


def records_of(blob: bytes) -> list[FileRecord]:
    return list(read(io.BytesIO(blob)))


# ------------------------------------------------------------------------------------------ linktypes

def test_linktype_lookup():
    assert linktypes.lookup("en10mb") == linktypes.EN10MB
    assert linktypes.lookup("DLT_RAW").number == 101
    assert linktypes.lookup("LINKTYPE_LINUX_SLL2").number == 276
    assert linktypes.lookup("229") is linktypes.IPV6
    assert linktypes.lookup(105).name == "IEEE802_11"
    assert linktypes.lookup("ieee802_11_radio").number == 127
    for bad in ("nosuch", "99999", "", "DLT_", -1):
        with pytest.raises(linktypes.UnknownLinkType, match="EN10MB"):
            linktypes.lookup(bad)
    assert issubclass(linktypes.UnknownLinkType, FcapError)
    assert len(linktypes.all_linktypes()) >= 20
    assert len({lt.number for lt in linktypes.all_linktypes()}) == len(linktypes.all_linktypes())


def test_dlt_for_libpcap():
    assert linktypes.dlt_for_libpcap(101) == 12
    assert linktypes.dlt_for_libpcap(linktypes.RAW) == 12
    for lt in (0, 1, 105, 108, 113, 127, 228, 229, 276):
        assert linktypes.dlt_for_libpcap(lt) == lt
    assert linktypes.linktype_from_dlt(12) == 101


def test_dlt_values_compile_in_libpcap():
    pcapy = pytest.importorskip("pcapy", reason="pcapy-ng is not installed")
    for lt in linktypes.COMMON:
        pcapy.compile(linktypes.dlt_for_libpcap(lt), 65535, "", 1, 0)
    with pytest.raises(pcapy.PcapError):
        pcapy.compile(101, 65535, "ip", 1, 0)  # the reason dlt_for_libpcap exists


# ------------------------------------------------------------------------------------------ writers

def test_format_for_path_and_open_writer():
    assert format_for_path("x.pcapng") == "pcapng"
    assert format_for_path("/a/b.PCAP") == "pcap"
    assert format_for_path("b.cap") == format_for_path("b.dmp") == "pcap"
    assert format_for_path("b.out") == format_for_path("noext") == "pcapng"
    assert isinstance(open_writer(io.BytesIO(), "pcap"), PcapWriter)
    assert isinstance(open_writer(io.BytesIO(), "pcapng"), PcapngWriter)
    with pytest.raises(ValueError, match="pcapng"):
        open_writer(io.BytesIO(), "erf")


def test_pcap_header_layout():
    b = io.BytesIO()
    PcapWriter(b, 101, 65535, closefd=False)
    magic, major, minor, zone, sigfigs, snaplen, network = struct.unpack("=IHHiIII", b.getvalue())
    assert (magic, major, minor, zone, sigfigs, snaplen, network) == (0xA1B23C4D, 2, 4, 0, 0, 65535, 101)


def test_pcap_writer_misuse():
    w = PcapWriter(io.BytesIO())
    with pytest.raises(ValueError, match="add_interface"):
        w.write(0, b"x", 1)
    assert w.add_interface("lo", 1, 100) == 0
    with pytest.raises(ValueError, match="one interface"):
        w.add_interface("eth0", 1, 100)
    with pytest.raises(ValueError, match="iface"):
        w.write(0, b"x", 1, iface=1)
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        w.write(2**32 * NS, b"x", 1)
    with pytest.raises(ValueError):
        w.write(-1, b"x", 1)
    with pytest.raises(ValueError):
        PcapWriter(io.BytesIO(), 1, 0)


def test_pcapng_writer_misuse():
    w = PcapngWriter(io.BytesIO())
    with pytest.raises(ValueError, match="no interface 0"):
        w.write(0, b"x", 1)
    w.add_interface("lo", 1)
    for kw in ({"iface": 1}, {"iface": -1}):
        with pytest.raises(ValueError):
            w.write(0, b"x", 1, **kw)
    for ts in (-1, 2**64):
        with pytest.raises(ValueError):
            w.write(ts, b"x", 1)
    with pytest.raises(ValueError, match="packet_id"):
        w.write(0, b"x", 1, packet_id=2**64)
    with pytest.raises(ValueError):
        w.add_interface("big", 70000)


def test_writers_truncate_to_snaplen_and_take_memoryviews():
    buf = memoryview(bytearray(range(256)) * 4)
    for fmt in ("pcap", "pcapng"):
        b = io.BytesIO()
        w = open_writer(b, fmt, closefd=False)
        w.add_interface("lo", 1, 100)
        w.write(7, buf[3:503], 500)
        w.write(8, buf[:10], 10)
        w.close()
        recs = records_of(b.getvalue())
        assert [(r.ts_ns, r.data, r.orig_len) for r in recs] == [(7, bytes(buf[3:103]), 500), (8, bytes(buf[:10]), 10)]


def test_close_and_context_manager(tmp_path):
    p = tmp_path / "x.pcapng"
    with open_writer(open(p, "wb"), "pcapng") as w:
        w.add_interface("lo", 1)
        w.write(1, b"abc", 3)
    assert w._file.closed
    w.close()  # idempotent
    assert [r.data for r in read(p)] == [b"abc"]
    keep = io.BytesIO()
    PcapWriter(keep, 1, closefd=False).close()
    assert not keep.closed


# ------------------------------------------------------------------------------------------ round trips

payloads = st.binary(max_size=300)
ts_pcap = st.integers(0, 2**32 * NS - 1)
ts_pcapng = st.integers(0, 2**63 - 1)
names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20)


@st.composite
def pcap_packets(draw):
    out = []
    for data in draw(st.lists(payloads, max_size=20)):
        out.append((draw(ts_pcap), data, len(data) + draw(st.integers(0, 70000))))
    return out


@settings(max_examples=150, deadline=None)
@given(linktype=st.sampled_from([lt.number for lt in linktypes.all_linktypes()]), packets=pcap_packets())
def test_roundtrip_pcap(linktype, packets):
    b = io.BytesIO()
    w = PcapWriter(b, linktype, 65535, closefd=False)
    for ts, data, orig in packets:
        w.write(ts, data, orig, flags=1, comment="dropped: pcap has no place for it", packet_id=5)
    w.close()
    assert records_of(b.getvalue()) == [FileRecord(ts, data, orig, linktype) for ts, data, orig in packets]


@st.composite
def pcapng_capture(draw):
    ifaces = draw(st.lists(st.tuples(names, st.sampled_from([1, 101, 105, 113, 127, 228, 229, 276]),
                                     st.integers(1, 400), names), min_size=1, max_size=4))
    packets = []
    for _ in range(draw(st.integers(0, 25))):
        iface = draw(st.integers(0, len(ifaces) - 1))
        data = draw(payloads)
        packets.append((iface, draw(ts_pcapng), data, len(data) + draw(st.integers(0, 2**32 - 1 - len(data))),
                        draw(st.none() | st.integers(0, 2**32 - 1)), draw(st.none() | st.text(max_size=40)),
                        draw(st.none() | st.integers(0, 2**64 - 1))))
    return ifaces, packets


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capture=pcapng_capture(), late=st.integers(0, 3))
def test_roundtrip_pcapng(capture, late):
    ifaces, packets = capture
    b = io.BytesIO()
    w = PcapngWriter(b, closefd=False)
    added = 0
    expected = []
    for i, (iface, ts, data, orig, flags, comment, pid) in enumerate(packets):
        while added <= iface or (i == late and added < len(ifaces)):  # some IDBs come after packets
            assert w.add_interface(*ifaces[added][:3], description=ifaces[added][3]) == added
            added += 1
        w.write(ts, data, orig, iface=iface, flags=flags, comment=comment, packet_id=pid)
        name, linktype, snaplen, _ = ifaces[iface]
        expected.append(FileRecord(ts, data[:snaplen], orig, linktype, iface, name or None, flags, comment, pid))
    w.close()
    assert records_of(b.getvalue()) == expected


# ------------------------------------------------------------------------------------------ files for external readers

COMMENTS = ["héllo wörld", "✓ 🐍 \"quoted\", comma | pipe", "plain"]


def rich_capture(path: Path, seed: int = 1, single_linktype: bool = False) -> list[FileRecord]:
    """A pcapng file with several interfaces, flags, comments, packet ids; returns what was written."""
    rnd = random.Random(seed)
    ifaces = [("lo", 1, 262144, "loopback"), ("ip_output", 1 if single_linktype else 101, 262144, ""),
              ("eth0", 1, 262144, "")]
    out = []
    with open_writer(open(path, "wb"), "pcapng") as w:
        for name, lt, snap, desc in ifaces[:2]:
            w.add_interface(name, lt, snap, desc)
        for i in range(60):
            if i == 30:
                w.add_interface(*ifaces[2][:3])
            iface = rnd.randrange(3 if i >= 30 else 2)
            ts = rnd.choice([rnd.randrange(2**31 * NS), 1_700_000_000 * NS + rnd.randrange(NS), 0, 2**31 * NS - 1])
            data = rnd.randbytes(rnd.randrange(0, 200))
            orig = len(data) + rnd.choice([0, 0, 1, 1400])
            flags = rnd.choice([None, FLAG_INBOUND, FLAG_OUTBOUND])
            comment = rnd.choice([None, None] + COMMENTS)
            pid = rnd.choice([None, rnd.randrange(2**64), 1])
            w.write(ts, data, orig, iface, flags, comment, pid)
            out.append(FileRecord(ts, data, orig, ifaces[iface][1], iface, ifaces[iface][0], flags, comment, pid))
    assert list(read(path)) == out
    return out


def rich_pcap(path: Path, seed: int = 2, tmax: int = 2**32 * NS) -> list[FileRecord]:
    rnd = random.Random(seed)
    out = []
    with open_writer(open(path, "wb"), "pcap") as w:
        w.add_interface("", 1, 262144)
        for _ in range(40):
            ts, data = rnd.randrange(tmax), rnd.randbytes(rnd.randrange(200))
            orig = len(data) + rnd.choice([0, 9])
            w.write(ts, data, orig)
            out.append(FileRecord(ts, data, orig, 1))
    assert list(read(path)) == out
    return out


def tshark_fields(path: Path, fields: list[str]) -> list[dict]:
    cmd = [TSHARK, "-n", "-r", str(path), "-T", "json"] + [a for f in fields for a in ("-e", f)]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [pkt["_source"]["layers"] for pkt in json.loads(p.stdout)]


def epoch_ns(text: str) -> int:
    return int(Decimal(text) * NS)


@need_tshark
def test_tshark_reads_pcapng(tmp_path):
    recs = rich_capture(tmp_path / "rich.pcapng")
    fields = ["frame.time_epoch", "frame.len", "frame.cap_len", "frame.interface_id", "frame.interface_name",
              "frame.comment", "frame.packet_flags_direction", "frame.packet_id", "frame.encap_type"]
    got = tshark_fields(tmp_path / "rich.pcapng", fields)
    assert len(got) == len(recs)
    for r, t in zip(recs, got):
        assert epoch_ns(t["frame.time_epoch"][0]) == r.ts_ns
        assert int(t["frame.len"][0]) == r.orig_len
        assert int(t["frame.cap_len"][0]) == len(r.data)
        assert int(t["frame.interface_id"][0]) == r.iface
        assert t["frame.interface_name"] == [r.iface_name]
        assert t.get("frame.comment") == ([r.comment] if r.comment else None)
        assert int(t.get("frame.packet_flags_direction", ["0"])[0], 16) == (r.flags or 0)
        assert t.get("frame.packet_id") == (None if r.packet_id is None else [str(r.packet_id)])


@need_tshark
def test_tshark_reads_pcap(tmp_path):
    recs = rich_pcap(tmp_path / "x.pcap")  # seconds beyond 2**31: pcap's field is unsigned
    got = tshark_fields(tmp_path / "x.pcap", ["frame.time_epoch", "frame.len", "frame.cap_len"])
    assert [(epoch_ns(t["frame.time_epoch"][0]), int(t["frame.len"][0]), int(t["frame.cap_len"][0])) for t in got] \
        == [(r.ts_ns, r.orig_len, len(r.data)) for r in recs]


def tcpdump_times(path: Path) -> list[int]:
    p = subprocess.run([TCPDUMP, "--nano", "-tt", "-nn", "-q", "-r", str(path)], check=False, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return [epoch_ns(m) for m in re.findall(r"^(\d+\.\d{9}) ", p.stdout, re.MULTILINE)]


def tcpdump_copy(path: Path, out: Path) -> list[FileRecord]:
    """libpcap reads path and writes it as a nanosecond pcap: its view of every packet, bytes included."""
    p = subprocess.run([TCPDUMP, "--time-stamp-precision=nano", "-r", str(path), "-w", str(out)],
                       check=False, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return list(read(out))


@need_tcpdump
@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_tcpdump_reads_ours(tmp_path, fmt):
    path = tmp_path / f"x.{fmt}"
    # libpcap 1.10 takes one linktype per pcapng file and reads pcap seconds as signed
    recs = rich_capture(path, single_linktype=True) if fmt == "pcapng" else rich_pcap(path, tmax=2**31 * NS)
    assert tcpdump_times(path) == [r.ts_ns for r in recs]
    copied = tcpdump_copy(path, tmp_path / "copy.pcap")
    assert [(r.ts_ns, r.data, r.orig_len, r.linktype) for r in copied] == \
           [(r.ts_ns, r.data, r.orig_len, r.linktype) for r in recs]


def test_dpkt_reads_ours(tmp_path):
    dpkt = pytest.importorskip("dpkt")
    for name, make, reader in (("x.pcap", rich_pcap, dpkt.pcap.Reader),
                               ("x.pcapng", rich_capture, dpkt.pcapng.Reader)):
        recs = make(tmp_path / name)
        with open(tmp_path / name, "rb") as f:
            got = list(reader(f))
        assert [buf for _, buf in got] == [r.data for r in recs]
        for (ts, _), r in zip(got, recs):
            if isinstance(ts, Decimal):  # dpkt's pcapng reader: exact
                assert int(ts * NS) == r.ts_ns
            else:  # dpkt's pcap reader: floats
                assert ts == pytest.approx(r.ts_ns / NS, abs=2e-6)


def test_scapy_reads_ours(tmp_path):
    utils = pytest.importorskip("scapy.utils")
    recs = rich_capture(tmp_path / "x.pcapng")
    got = list(utils.RawPcapNgReader(str(tmp_path / "x.pcapng")))
    assert len(got) == len(recs)
    for (data, m), r in zip(got, recs):
        assert data == r.data and m.wirelen == r.orig_len and m.linktype == r.linktype
        assert ((m.tshigh << 32) | m.tslow) * NS // m.tsresol == r.ts_ns
        assert m.ifname.decode() == r.iface_name
        assert m.direction == (r.flags & 3 if r.flags is not None else None)
        assert m.comments == ([r.comment.encode()] if r.comment else None)
    recs = rich_pcap(tmp_path / "x.pcap")
    reader = utils.RawPcapReader(str(tmp_path / "x.pcap"))
    got = [(data, m.sec * NS + m.usec, m.wirelen) for data, m in reader]  # usec holds ns for the nano magic
    assert got == [(r.data, r.ts_ns, r.orig_len) for r in recs]


# ------------------------------------------------------------------------------------------ reader: hand-made inputs

def pcap_blob(endian: str, magic: int, recs, major=2, minor=4, snaplen=65535, network=1) -> bytes:
    out = struct.pack(endian + "IHHiIII", magic, major, minor, 0, 0, snaplen, network)
    for sec, frac, data, length in recs:
        out += struct.pack(endian + "IIII", sec, frac, len(data), length) + data
    return out


@pytest.mark.parametrize("endian", "<>")
@pytest.mark.parametrize("magic,scale", [(0xA1B2C3D4, 1000), (0xA1B23C4D, 1)])
def test_pcap_all_magics(endian, magic, scale):
    blob = pcap_blob(endian, magic, [(1700000000, 999999, b"abc", 60), (5, 0, b"", 0)], network=0x10000065)
    assert records_of(blob) == [FileRecord(1700000000 * NS + 999999 * scale, b"abc", 60, 101),
                                FileRecord(5 * NS, b"", 0, 101)]


def test_pcap_old_versions_and_snaplen():
    # version 2.2 wrote caplen and len swapped; libpcap swaps them back
    blob = pcap_blob("<", 0xA1B2C3D4, [], minor=2) + struct.pack("<IIII", 0, 0, 9, 2) + b"ab"
    assert records_of(blob) == [FileRecord(0, b"ab", 9, 1)]
    # records beyond the header's snaplen are cut to it, as libpcap does
    assert records_of(pcap_blob("<", 0xA1B2C3D4, [(0, 0, b"abcdef", 6)], snaplen=4))[0].data == b"abcd"


def opt(e, code, value):
    return struct.pack(e + "HH", code, len(value)) + value + b"\0" * (-len(value) & 3)


def block(e, btype, body):
    return struct.pack(e + "II", btype, len(body) + 12) + body + struct.pack(e + "I", len(body) + 12)


def shb(e):
    return block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1) + opt(e, 4, b"test") + opt(e, 0, b""))


def idb(e, linktype, options=b"", snaplen=0):
    return block(e, 1, struct.pack(e + "HHI", linktype, 0, snaplen) + options)


def epb(e, iface, ts, data, length=None, options=b""):
    pad = b"\0" * (-len(data) & 3)
    return block(e, 6, struct.pack(e + "IIIII", iface, ts >> 32, ts & 0xFFFFFFFF, len(data),
                                   len(data) if length is None else length) + data + pad + options)


def test_pcapng_sections_resolutions_and_old_blocks():
    b, little = ">", "<"
    blob = (shb(b)
            + idb(b, 101, opt(b, 2, b"eth9\0") + opt(b, 9, b"\x94") + opt(b, 14, struct.pack(b + "q", 10)))  # 2^-20 s
            + block(b, 4, b"\0" * 8)  # name resolution block: skipped
            + epb(b, 0, 3 << 20 | 1 << 19, b"ip", 40, opt(b, 2, struct.pack(b + "I", 2)) + opt(b, 1, b"one")
                  + opt(b, 1, b"two") + opt(b, 5, struct.pack(b + "Q", 77)) + opt(b, 0, b""))
            + block(b, 3, struct.pack(b + "I", 3) + b"xyz\0")  # simple packet block
            + block(b, 0x40000BAD, b"\0" * 8)  # custom block: skipped
            + shb(little)  # a new section in the other byte order: interfaces start again
            + idb(little, 1)  # no if_tsresol: microseconds
            + idb(little, 228, opt(little, 9, b"\x0c"))  # picoseconds
            + block(little, 2, struct.pack(little + "HHIIII", 1, 0, 0, 1_500_000, 2, 2) + b"ab\0\0"
                    + opt(little, 2, struct.pack(little + "I", 1)))  # obsolete packet block
            + epb(little, 0, 2_000_001, b"e"))
    assert records_of(blob) == [
        FileRecord(10 * NS + 3_500_000_000, b"ip", 40, 101, 0, "eth9", 2, "one\ntwo", 77),
        FileRecord(0, b"xyz", 3, 101, 0, "eth9"),
        FileRecord(1_500, b"ab", 2, 228, 1, None, 1),
        FileRecord(2_000_001_000, b"e", 1, 1, 0),
    ]
    if TSHARK:  # an independent reading of the same blocks
        p = Path(os.environ.get("TMPDIR", "/tmp")) / f"fcap-test-{os.getpid()}.pcapng"
        try:
            p.write_bytes(blob)
            got = tshark_fields(p, ["frame.time_epoch", "frame.len", "frame.encap_type"])
        finally:
            p.unlink()
        got = [t for t in got if "frame.encap_type" in t]  # tshark shows the custom block as a record too
        times = [epoch_ns(t["frame.time_epoch"][0]) if "frame.time_epoch" in t else None for t in got]
        assert times == [13_500_000_000, None, 1_500, 2_000_001_000]  # tshark gives an SPB no time


BAD = {
    "empty": b"",
    "short magic": b"\xd4\xc3",
    "unknown magic": b"GIF89a" + bytes(30),
    "short pcap header": pcap_blob("<", 0xA1B2C3D4, [])[:20],
    "pcap version": pcap_blob("<", 0xA1B2C3D4, [], major=3),
    "truncated record header": pcap_blob("<", 0xA1B2C3D4, [(0, 0, b"abc", 3)])[:30],
    "truncated record data": pcap_blob("<", 0xA1B2C3D4, [(0, 0, b"abc", 3)])[:-1],
    "huge caplen": pcap_blob("<", 0xA1B2C3D4, []) + struct.pack("<IIII", 0, 0, 0xFFFFFFF0, 1),
    "bad byte-order magic": b"\n\r\r\n" + struct.pack("<II", 28, 0x12345678) + bytes(16),
    "shb length": shb("<")[:4] + struct.pack("<I", 30) + shb("<")[8:],
    "pcapng version": block("<", 0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 2, 0, -1)),
    "trailer mismatch": shb("<") + idb("<", 1)[:-4] + struct.pack("<I", 99),
    "block length not multiple of 4": shb("<") + struct.pack("<II", 1, 21) + bytes(13),
    "block length below 12": shb("<") + struct.pack("<II", 1, 8),
    "truncated block": shb("<") + idb("<", 1)[:-2],
    "truncated block header": shb("<") + b"\1\0\0",
    "packet before IDB": shb("<") + epb("<", 0, 0, b"x"),
    "unknown interface": shb("<") + idb("<", 1) + epb("<", 1, 0, b"x"),
    "caplen beyond block": shb("<") + idb("<", 1) + block("<", 6, struct.pack("<IIIII", 0, 0, 0, 99, 99) + b"ab\0\0"),
    "short EPB": shb("<") + idb("<", 1) + block("<", 6, bytes(8)),
    "short IDB": shb("<") + block("<", 1, bytes(4)),
    "IDB option overrun": shb("<") + idb("<", 1, struct.pack("<HH", 2, 200)),
    "tsresol length": shb("<") + idb("<", 1, opt("<", 9, b"\x06\x06")),
    "SPB before IDB": shb("<") + block("<", 3, struct.pack("<I", 1) + b"x\0\0\0"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_malformed_input_raises_pcap_format_error(name):
    with pytest.raises(PcapFormatError) as info:
        records_of(BAD[name])
    assert str(info.value)  # says what is wrong


def test_records_before_damage_are_yielded():
    blob = pcap_blob("<", 0xA1B23C4D, [(1, 2, b"ok", 2), (3, 4, b"cut", 3)])[:-1]
    it = read(io.BytesIO(blob))
    assert next(it) == FileRecord(NS + 2, b"ok", 2, 1)
    with pytest.raises(PcapFormatError, match="truncated"):
        next(it)


def test_header_checked_before_iteration():
    with pytest.raises(PcapFormatError, match="unknown file format"):
        read(io.BytesIO(b"not a capture file"))


def test_packet_options_past_their_block_end_the_options_only():
    """libpcap reads no packet options and tcpdump prints such a packet: so do we, with the options before it."""
    blob = shb("<") + idb("<", 1) + epb("<", 0, 0, b"x", options=opt("<", 1, b"ok") + struct.pack("<HH", 1, 200))
    assert records_of(blob) == [FileRecord(0, b"x", 1, 1, 0, None, None, "ok")]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_files_raise_only_pcap_format_error(data, tmp_path_factory):
    base = _damage_bases(tmp_path_factory)
    blob = bytearray(data.draw(st.sampled_from(base)))
    for _ in range(data.draw(st.integers(1, 4))):
        if not blob:
            break
        if data.draw(st.booleans()):
            del blob[data.draw(st.integers(0, len(blob) - 1)):]
        else:
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
    try:
        for _ in read(io.BytesIO(bytes(blob))):
            pass
    except PcapFormatError:
        pass


_BASES: list[bytes] = []


def _damage_bases(factory) -> list[bytes]:
    if not _BASES:
        d = factory.mktemp("damage")
        rich_capture(d / "a.pcapng")
        rich_pcap(d / "a.pcap")
        _BASES.extend((d / n).read_bytes()[:4000] for n in ("a.pcapng", "a.pcap"))
        _BASES.extend(f.read_bytes()[:4000] for f in sorted(CORPUS.glob("*.pcapng"))[:10])
    return _BASES


# ------------------------------------------------------------------------------------------ reader: tcpdump's corpus

def _tcpdump_count(path: Path) -> tuple[int, int | None, str]:
    p = subprocess.run([TCPDUMP, "--count", "-r", str(path)], check=False, capture_output=True, text=True, timeout=60)
    m = re.search(r"^(\d+) packets?", p.stdout, re.MULTILINE)
    return p.returncode, int(m.group(1)) if m else None, p.stderr.strip()


@need_tcpdump
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")
def test_corpus_counts_match_tcpdump():
    files = sorted(f for f in CORPUS.iterdir() if f.suffix in (".pcap", ".pcapng"))
    assert len(files) > 800
    with ThreadPoolExecutor(4) as pool:
        verdicts = dict(zip(files, pool.map(_tcpdump_count, files)))
    problems = []
    total = 0
    for f in files:
        n, err = 0, None
        try:
            for _ in read(f):
                n += 1
        except PcapFormatError as e:
            err = str(e)
        total += n
        rc, count, _stderr = verdicts[f]
        if rc == 0 and (err is not None or n != count):
            problems.append(f"{f.name}: ours {n} {err or ''}; tcpdump {count}")
    assert not problems, "\n".join(problems)
    assert total > 10000


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"no corpus at {CORPUS}")
def test_corpus_bytes_match_dpkt():
    dpkt = pytest.importorskip("dpkt")
    compared = 0
    for f in sorted(CORPUS.glob("*.pcap")):
        with open(f, "rb") as fh:
            theirs = [buf for _, buf in dpkt.pcap.Reader(fh)]
        ours = [r.data for r in read(f)]
        assert len(ours) == len(theirs), f.name
        assert ours == [buf[:len(o)] for buf, o in zip(theirs, ours)], f.name  # ours cut at snaplen like libpcap
        compared += len(ours)
    assert compared > 8000
