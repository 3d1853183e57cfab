"""fcap.text.fastlines (-r's lines a batch at a time) against the Printer packet by packet, the reference: every
Ethernet frame of tcpdump's test captures and of bench.printing's mixed file, whole, cut short, with bytes changed,
with odd pcap times, in every time style that has no state, -S, --nano, -v; the text must be the same, character for
character, and the table of relative sequence numbers the same after. Then the command: a big file's `fcap -r -nn`
is tcpdump's own output, -c stops where it says, and a damaged file prints the packets before the damage and the
same one-line error as packet by packet."""

from __future__ import annotations

import io
import random
import struct
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import need_tool
from corpus import ethernet_frames
from netns import run_fcap

from fcap.files import linktypes
from fcap.files.pcapread import read
from fcap.text.printer import Printer, PrintOptions

fastlines = pytest.importorskip("fcap.text.fastlines", reason="fcap.text.fastlines needs numpy")
fastfile = pytest.importorskip("fcap.text.fastfile", reason="fcap.text.fastfile needs numpy")
fastflows = pytest.importorskip("fcap.text.fastflows", reason="fcap.text.fastflows needs numpy")
EN10MB = linktypes.EN10MB.number


def _frames() -> list[bytes]:
    return ethernet_frames()


def _records(rng: random.Random) -> list[tuple[int, int, bytes, int]]:
    """(seconds, fraction, bytes, original length): each frame whole, cut short, and with a byte changed; a
    few times a fraction of a second or more (tcpdump prints those as the file holds them)."""
    out = []
    t = 1_780_000_000
    for k, frame in enumerate(_frames()):
        variants = [(frame, len(frame))]
        cuts = range(14, min(len(frame), 96)) if k % 16 == 0 else (14, 34, 42, 54, 60, 66, 74)
        for cut in cuts:   # (every length for some frames: each bound of each header)
            if cut < len(frame):
                variants += [(frame[:cut], len(frame)), (frame[:cut], cut)]
        for _ in range(3):
            b = bytearray(frame)
            if b:
                b[rng.randrange(min(len(b), 80))] = rng.randrange(256)
            variants.append((bytes(b), len(b)))
        for at in (16, 18, 20, rng.randrange(12, 58)):   # (two bytes zeroed: IPv4's and IPv6's lengths, offsets)
            if at + 2 < len(frame):
                variants.append((frame[:at] + bytes(2) + frame[at + 2:], len(frame)))
        for data, orig in variants:
            t += rng.choice((0, 0, 1))
            frac = rng.randrange(1_000_000) if rng.random() > 0.002 else 1_000_000 + rng.randrange(5)
            out.append((t, frac, data, orig))
    return out


def _pcap(path, records, nano: bool = False, order: str = "<") -> None:
    with open(path, "wb") as f:
        f.write(struct.pack(order + "IHHiIII", 0xA1B23C4D if nano else 0xA1B2C3D4, 2, 4, 0, 0, 262144, EN10MB))
        for sec, frac, data, orig in records:
            f.write(struct.pack(order + "IIII", sec, frac * 1000 if nano and frac < 1_000_000 else frac, len(data),
                                orig) + data)


def _reference(path, options: PrintOptions) -> str:
    out = io.StringIO()
    printer = Printer(options, out)
    for rec in read(path):
        printer.packet(rec.ts_ns, rec.data, rec.linktype, rec.orig_len, stamp=rec.stamp)
    return out.getvalue()


@pytest.fixture(scope="module")
def records():
    return _records(random.Random(43))


@pytest.mark.parametrize("options", [
    PrintOptions(), PrintOptions(absolute_seq=True), PrintOptions(time=1), PrintOptions(time=2),
    PrintOptions(time=4), PrintOptions(nano=True), PrintOptions(verbose=1), PrintOptions(verbose=2, time=2),
    PrintOptions(verbose=1, no_checksums=True)], ids=["default", "-S", "-t", "-tt", "-tttt", "nano", "-v",
                                                      "-vv -tt", "-v -K"])
def test_batches_print_what_the_printer_prints(records, options, tmp_path):
    path = tmp_path / "frames.pcap"
    _pcap(path, records, nano=options.nano, order="<" if options.time != 2 else ">")
    out = io.StringIO()
    printer = Printer(options, out)
    assert fastfile.print_pcap(str(path), printer) == (len(records), True)
    want = _reference(path, options)
    got = out.getvalue()
    if got != want:   # the first line that differs, not two pages of text
        for n, (a, b) in enumerate(zip(got.splitlines(), want.splitlines())):
            assert a == b, f"line {n}"
    assert got == want
    assert printer.counted == len(records)
    assert len(records) > 20000


def test_the_sequence_numbers_table_is_the_printers(records, tmp_path):
    """The relative numbers go on from one batch to the next and through the packets the Printer prints: a
    segment's line printed by the Printer after the batches is the one it prints after its own walk."""
    path = tmp_path / "frames.pcap"
    _pcap(path, records)
    fast, slow = Printer(PrintOptions(), io.StringIO()), Printer(PrintOptions(), io.StringIO())
    fastfile.print_pcap(str(path), fast)
    for rec in read(path):
        slow.packet(rec.ts_ns, rec.data, rec.linktype, rec.orig_len, stamp=rec.stamp)
    assert fast.summarizer.seqs == slow.summarizer.seqs and len(slow.summarizer.seqs) > 100


def _mixed(tmp_path, n: int):
    from bench.printing import write_file
    path = tmp_path / "mixed.pcap"
    write_file(str(path), n)
    return path


def test_a_big_file_prints_as_tcpdump_prints_it(tmp_path):
    """The command's lines of bench.printing's mixed file (big enough for batches) are tcpdump -nn's, byte for byte;
    -c 1234 prints the first 1234 of them."""
    tcpdump = need_tool("tcpdump")
    path = _mixed(tmp_path, 30000)
    theirs = subprocess.run([tcpdump, "-nn", "-r", str(path)], capture_output=True, timeout=120)
    ours = run_fcap(["-r", str(path), "-nn"])
    assert ours.returncode == 0 and ours.stderr == b"", ours.stderr
    assert ours.stdout == theirs.stdout
    assert len(ours.stdout.splitlines()) == 30000
    first = run_fcap(["-r", str(path), "-nn", "-c", "1234"])
    assert first.stdout.splitlines() == theirs.stdout.splitlines()[:1234]
    for flags in (["-v"], ["-vv", "-c", "999"]):   # (-v: the IP header's line and checksums, a batch at a time)
        theirs = subprocess.run([tcpdump, "-nn", *flags, "-r", str(path)], capture_output=True, timeout=120)
        ours = run_fcap(["-r", str(path), "-nn", *flags])
        assert ours.stdout == theirs.stdout and b"cksum" in ours.stdout, flags


def test_a_big_files_json_is_jsonout_packet_by_packet(tmp_path):
    from fcap.live.output import file_packet
    from fcap.text.jsonout import packet_line
    path = _mixed(tmp_path, 30000)
    ours = run_fcap(["-r", str(path), "--json"])
    assert ours.returncode == 0 and ours.stderr == b"", ours.stderr
    assert ours.stdout.decode() == "".join(packet_line(file_packet(rec)) for rec in read(path))


def test_a_damaged_big_file_prints_the_packets_before_and_one_line(tmp_path):
    """A big file cut inside a record, and one with a record's length past the snapshot length: the lines of the
    packets before the damage, then the error packet by packet gives (the reader's, naming the damage)."""
    path = _mixed(tmp_path, 30000)
    raw = path.read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(raw[:-50])
    bad = tmp_path / "bad.pcap"
    at = 24
    for _ in range(20000):   # (record 20001's caplen made 10 MB)
        at += 16 + struct.unpack_from("<I", raw, at + 8)[0]
    bad.write_bytes(raw[:at + 8] + struct.pack("<I", 10 << 20) + raw[at + 12:])
    for damaged, before in ((cut, 29999), (bad, 20000)):
        r = run_fcap(["-r", str(damaged), "-nn"])
        good = _reference_until_damage(damaged)
        assert r.returncode != 0
        assert r.stdout.decode() == good and len(good.splitlines()) == before
        err = r.stderr.decode()
        assert len(err.splitlines()) == 1 and ("truncated dump file" in err or "invalid packet capture length" in err)


def _reference_until_damage(path) -> str:
    out = io.StringIO()
    printer = Printer(PrintOptions(), out)
    try:
        for rec in read(path):
            printer.packet(rec.ts_ns, rec.data, rec.linktype, rec.orig_len, stamp=rec.stamp)
    except Exception:   # noqa: BLE001 - the damage: what came before is the reference
        pass
    return out.getvalue()


def test_json_batches_write_what_jsonout_writes(records, tmp_path):
    """-r --json a batch at a time (fcap.text.fastjson): the same lines as fcap.text.jsonout's packet by packet,
    over the same frames (whole, cut, changed); -c's limit too."""
    fastjson = pytest.importorskip("fcap.text.fastjson")
    from fcap.live.output import JsonSink, file_packet
    from fcap.text.jsonout import packet_line
    path = tmp_path / "frames.pcap"
    _pcap(path, records)
    want = "".join(packet_line(file_packet(rec)) for rec in read(path))
    out = io.StringIO()
    assert fastjson.json_pcap(str(path), out, JsonSink.file_line) == (len(records), True)
    got = out.getvalue()
    if got != want:
        for n, (a, b) in enumerate(zip(got.splitlines(), want.splitlines())):
            assert a == b, f"line {n}"
    assert got == want
    first = io.StringIO()
    assert fastjson.json_pcap(str(path), first, JsonSink.file_line, limit=999) == (999, True)
    assert first.getvalue().splitlines() == want.splitlines()[:999]


def test_read_gives_a_big_pcap_files_packets_a_batch_at_a_time(tmp_path):
    """fcap.read() of a big pcap file (its Packets made from fcap.files.batches): the Packets, their attributes and
    dictionaries as file_packet() makes them of the records; a damaged file: the packets before the damage, then
    the reader's error."""
    import pickle

    import fcap
    from fcap.errors import PcapFormatError
    from fcap.live.output import file_packet
    path = _mixed(tmp_path, 30000)
    want = [file_packet(rec) for rec in read(path)]
    got = list(fcap.read(path))
    assert got == want and len(got) == 30000
    assert all(a.__dict__ == b.__dict__ for a, b in zip(got, want))
    assert type(got[0]) is type(want[0]) and pickle.loads(pickle.dumps(got[9])) == want[9]
    got[0].dumps["x"] = 1
    assert got[1].dumps == {}   # (each its own)
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(path.read_bytes()[:-50])
    seen = []
    with pytest.raises(PcapFormatError, match="truncated dump file"):
        for p in fcap.read(cut):
            seen.append(p)
    assert seen == want[:-1]


@pytest.mark.parametrize("group", [4096, 3])
def test_range_sums_are_the_words_sums(group, monkeypatch):
    """fcap.text.fastverbose.RangeSums (the machine's words at either alignment, added by reduceat a group of ranges
    at a time) against the sum of each range's big-endian words, an odd last byte padded with zero, as one's
    complement sums (congruent modulo 0xFFFF, zero where it is): ranges at odd and even offsets, odd and even
    lengths, empty ones, one at the very end, ranges of zeros, and ranges whose words add up to a multiple of
    0xFFFF; in one group, and in groups of 3 (out of order, overlapping)."""
    import numpy as np
    from fcap.text import fastverbose
    monkeypatch.setattr(fastverbose, "_GROUP", group)
    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(4001)) + bytes(40) + b"\x12\x34\xed\xcb\xff\xff\x00\x01\xff\xfe"
    sums = fastverbose.RangeSums(np.frombuffer(data, np.uint8))
    starts = [rng.randrange(0, 3900) for _ in range(400)] + [0, 1, 3999, 4000, 4001, 4011, 4041, 4045, 4045, 4042]
    lengths = [rng.randrange(0, 100) for _ in range(400)] + [4001, 4000, 2, 1, 40, 21, 4, 2, 6, 8]
    got = sums(np.array(starts), np.array(lengths)).tolist()

    def words(s: int, n: int) -> int:
        part = data[s:s + n] + b"\0" * (n % 2)
        return sum(int.from_bytes(part[i:i + 2], "big") for i in range(0, len(part), 2))
    want = [words(s, n) for s, n in zip(starts, lengths)]
    assert [(g % 0xFFFF, g == 0) for g in got] == [(w % 0xFFFF, w == 0) for w in want]
    assert any(w and w % 0xFFFF == 0 for w in want) and want.count(0) >= 2


@pytest.mark.parametrize("options", [PrintOptions(), PrintOptions(verbose=1)], ids=["default", "-v"])
def test_a_pcapng_file_prints_what_the_printer_prints_up_to_custom_options(records, options, tmp_path):
    """A pcapng file (fcap's writer: a comment on each packet, as fcap writes them) prints a batch at a time what
    the Printer prints packet by packet, and stops before the first packet carrying a custom option (a --dump's
    values, which the per-record path prints under its line)."""
    from fcap.defaults import NS
    from fcap.files.pcapfile import PcapngWriter
    recs = records[:5000]
    path = tmp_path / "frames.pcapng"
    with open(path, "wb") as f:
        w = PcapngWriter(f)
        w.add_interface("eth0", EN10MB)
        w.add_interface("lo", EN10MB)
        for k, (sec, frac, data, orig) in enumerate(recs):
            more = [(2989, b"\0\0\xa5\x9f" + b"x" * (k % 7))] if k in (4000, 4001) else []
            w.write(sec * NS + frac % 1_000_000 * 1000, data, orig, iface=k % 2, flags=1, comment=f"point {k}",
                    more=more)
    out = io.StringIO()
    printer = Printer(options, out)
    assert fastfile.print_pcap(str(path), printer) == (4000, False)
    want = io.StringIO()
    reference = Printer(options, want)
    for _, rec in zip(range(4000), read(path)):
        reference.packet(rec.ts_ns, rec.data, rec.linktype, rec.orig_len, stamp=rec.stamp)
    assert out.getvalue() == want.getvalue() and printer.counted == 4000


def test_relative_numbers_a_batch_at_once_and_in_order(tmp_path, monkeypatch):
    """The batch's segments get their relative numbers at once (fastflows.relative_numbers) where the Printer's packets
    touch none of their connections, and packet by packet where one does (a SYN-ACK whose options the templates
    do not lay out, which sets its connection's base): the same text as the Printer's either way, across a second
    SYN of the same ports (a new base), and the same table after."""
    from scapy.all import IP, TCP, Ether, Raw
    from test_show import tcp_conversation
    a, b = IP(src="10.1.0.1", dst="10.1.0.2"), IP(src="10.1.0.2", dst="10.1.0.1")
    again = [a / TCP(sport=50000, dport=8000, flags="S", seq=9), b / TCP(sport=8000, dport=50000, flags="SA", seq=5,
                                                                          ack=10),
             a / TCP(sport=50000, dport=8000, flags="PA", seq=10, ack=6) / Raw(b"x" * 20),
             b / TCP(sport=8000, dport=50000, flags="A", seq=6, ack=30)]
    calls = {"relative_numbers": 0, "_one_by_one": 0}
    for module, name in ((fastflows, "relative_numbers"), (fastlines, "_one_by_one")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, real=real, name=name: (
            calls.__setitem__(name, calls[name] + 1), real(*args))[1])
    for k, packets in enumerate((again * 3, tcp_conversation() + again)):
        path = tmp_path / f"c{k}.pcap"
        records = [(1_780_000_000 + i, 5, bytes(Ether() / p), len(Ether() / p)) for i, p in enumerate(packets * 40)]
        _pcap(path, records)
        out = io.StringIO()
        printer = Printer(PrintOptions(), out)
        fastfile.print_pcap(str(path), printer)
        reference = Printer(PrintOptions(), io.StringIO())
        assert out.getvalue() == _reference(path, PrintOptions())
        for rec in read(path):
            reference.packet(rec.ts_ns, rec.data, rec.linktype, rec.orig_len)
        assert printer.summarizer.seqs == reference.summarizer.seqs
        assert calls == ({"relative_numbers": 1, "_one_by_one": 0} if k == 0 else
                         {"relative_numbers": 1, "_one_by_one": 1})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=200), st.sampled_from(["<u8", "<i8", "u1"]))
def test_distinct_is_numpys_unique(values, dtype):
    """fastmerge.distinct (the printers' numbering of flows, variants and seconds) gives numpy.unique's first
    indices and inverse, whatever the order and repeats of the values, none included."""
    import numpy as np

    from fcap.live.fastmerge import distinct
    a = np.array(values, dtype)
    _, first, inverse = np.unique(a, return_index=True, return_inverse=True)
    got_first, got_inverse = distinct(a)
    assert got_first.tolist() == first.tolist() and got_inverse.tolist() == inverse.ravel().tolist()

