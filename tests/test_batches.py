"""fcap.batches: a file's packets as numpy arrays. Held to fcap.files.pcapread (the same packets, times, lengths,
link types and bytes over every capture of tcpdump's tests, damaged ones included) and to tshark (the decoded
addresses, protocol, ports and TCP flags over every IP packet of those captures, merged into one pcapng file);
and on a capture fcap writes itself."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytest.importorskip("numpy", reason="fcap.batches needs numpy")

import fcap
from fcap.errors import PcapFormatError
from fcap.files import pcapread
from fcap.files.batches import FIELDS, address, batches
from tests.corpus import CAPTURES

FILES = sorted(p for p in CAPTURES.glob("*") if p.suffix in (".pcap", ".pcapng", ".cap")) if CAPTURES.exists() \
    else []


def _records(path):
    """pcapread's records, and its error (None when the file reads whole)."""
    out = []
    try:
        for r in pcapread.read(path):
            out.append(r)
    except PcapFormatError as e:
        return out, e
    return out, None


def _rows(path, size=7):
    rows, err = [], None
    try:
        for b in batches(path, size):
            assert len(b) <= size
            rows += [(int(f["ts_ns"]), b.packet(i), int(f["len"]), int(f["linktype"]), int(f["iface"]))
                     for i, f in enumerate(b.fields)]
    except PcapFormatError as e:
        err = e
    return rows, err


@pytest.mark.skipif(not FILES, reason=f"no corpus at {CAPTURES}")
def test_batches_hold_what_the_reader_reads():
    checked = 0
    for path in FILES:
        recs, err = _records(path)
        rows, berr = _rows(path)
        assert (err is None) == (berr is None), f"{path.name}: reader {err}, batches {berr}"
        if err is None:
            assert rows == [(r.ts_ns, r.data, r.orig_len, r.linktype, r.iface) for r in recs], path.name
            checked += 1
        else:
            assert rows == [(r.ts_ns, r.data, r.orig_len, r.linktype, r.iface) for r in recs][:len(rows)], path.name
    assert checked > 500


TSHARK = ["ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "ip.proto", "ipv6.nxt", "tcp.srcport", "tcp.dstport",
          "udp.srcport", "udp.dstport", "sctp.srcport", "sctp.dstport", "tcp.flags"]


def _merged(tmp_path):
    """The corpus captures whose packets fcap decodes, concatenated into one pcapng file (mergecap -a)."""
    picked = []
    for path in FILES:
        try:
            if any(b.fields["ethertype"].any() for b in batches(path)):
                picked.append(str(path))
        except PcapFormatError:
            continue
    out = tmp_path / "all.pcapng"
    subprocess.run(["mergecap", "-a", "-F", "pcapng", "-w", str(out)] + picked, check=True, capture_output=True)
    return out


@pytest.mark.skipif(not FILES or not shutil.which("tshark") or not shutil.which("mergecap"),
                    reason="needs the corpus, tshark and mergecap")
def test_decoded_headers_are_tsharks(tmp_path):
    path = _merged(tmp_path)
    cmd = ["tshark", "-r", str(path), "-n", "-o", "ip.defragment:FALSE", "-o", "tcp.desegment_tcp_streams:FALSE",
           "-T", "fields", "-E", "occurrence=f", "-E", "separator=|"]
    lines = subprocess.run(cmd + [a for f in TSHARK for a in ("-e", f)], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    rows = [(f, b.packet(i)[12:14]) for b in batches(path) for i, f in enumerate(b.fields)]
    assert len(rows) == len(lines)
    compared = {"v4": 0, "v6": 0, "ports": 0, "flags": 0, "vlan": 0}
    for n, ((f, tag), line) in enumerate(zip(rows, lines), 1):
        t = dict(zip(TSHARK, line.split("|")))
        if _compare(n, f, t, compared) and f["linktype"] == 1 and tag in (b"\x81\x00", b"\x88\xa8"):
            compared["vlan"] += 1
    assert compared["v4"] > 4000 and compared["v6"] > 600 and compared["ports"] > 3000 and compared["flags"] > 1500 \
        and compared["vlan"] > 20, compared


def _compare(n: int, f, t: dict, compared: dict) -> bool:
    """One packet: what fcap decoded against tshark's first layer of each, where tshark saw the same layer; whether
    the addresses were compared."""
    src, dst = address(f["src"]), address(f["dst"])
    if f["ethertype"] == 0x0800 and src and t["ip.src"]:
        assert (src, dst, int(f["proto"])) == (t["ip.src"], t["ip.dst"], int(t["ip.proto"])), (n, t)
        compared["v4"] += 1
    elif f["ethertype"] == 0x86DD and src and t["ipv6.src"]:
        assert (src, dst, int(f["proto"])) == (t["ipv6.src"], t["ipv6.dst"], int(t["ipv6.nxt"])), (n, t)
        compared["v6"] += 1
    else:
        return False
    layer = {6: "tcp", 17: "udp", 132: "sctp"}.get(int(f["proto"]))
    if layer and f["sport"] | f["dport"] and t[f"{layer}.srcport"]:
        assert (int(f["sport"]), int(f["dport"])) == (int(t[f"{layer}.srcport"]), int(t[f"{layer}.dstport"])), (n, t)
        compared["ports"] += 1
        if layer == "tcp" and t["tcp.flags"]:
            assert int(f["tcp_flags"]) == int(t["tcp.flags"], 16) & 0xFF, (n, t)
            compared["flags"] += 1
    return True


def test_batches_of_a_file_fcap_wrote(tmp_path):
    """The API's spelling, on the pcaps/ capture made by fcap itself; bad input is one FcapError."""
    from pathlib import Path
    made = sorted(Path(__file__).resolve().parent.parent.joinpath("pcaps").glob("*.pcap*"))
    assert made
    for path in made:
        total = sum(len(b) for b in fcap.batches(path, size=3))
        assert total == sum(1 for _ in fcap.read(path))
    for bad, what in ((tmp_path / "none.pcap", "No such file"), (b"x", "a file name")):
        with pytest.raises(fcap.FcapError, match=what):
            list(fcap.batches(bad))
    assert FIELDS.names[:3] == ("ts_ns", "caplen", "len")


def _pcap_records(rnd, e: str, count: int, seconds: int, inner: float = 0.2) -> list[bytes]:
    """count records in byte order e, their seconds from `seconds` on; a share `inner` of the payloads hold pcap
    records of their own (a capture of a file's transfer) whose seconds share the file's top byte."""
    import struct
    out = []
    for i in range(count):
        if rnd.random() < inner:
            held = b"".join(struct.pack(e + "IIII", seconds + rnd.randrange(3), 0, n, n) + bytes(n)
                            for n in (rnd.randrange(0, 40) for _ in range(rnd.randrange(1, 4))))
            data = rnd.randbytes(rnd.randrange(0, 5)) + held + rnd.randbytes(rnd.randrange(0, 5))
        else:
            data = rnd.randbytes(rnd.choice((0, 1, 15, 16, 17, 60, 1400)))
        out.append(struct.pack(e + "IIII", seconds + i // 7, rnd.randrange(1000000), len(data), len(data) + 3)
                   + data)
    return out


@pytest.mark.parametrize("e", ["<", ">"])
def test_the_chain_at_c_speed_is_the_walks(e):
    """_chain finds a run of what the walk a record at a time finds, from any record (never other offsets): records
    whose payloads hold records of their own, seconds whose top byte changes within the buffer, a buffer cut
    anywhere, a damaged length; on a plain buffer, the whole walk."""
    import random

    import numpy as np

    from fcap.files.batches import _chain, _walk
    rnd = random.Random(7)
    found = 0
    for trial in range(300):
        seconds = rnd.choice((0x6A000000 - 3, 0x6A123456, 0, 0x6AFFFFFF - 2))   # (two cross a top byte)
        recs = _pcap_records(rnd, e, rnd.randrange(1, 60), seconds)
        buf = b"".join(recs)
        if trial % 3 == 1:
            buf = buf[:rnd.randrange(len(buf) + 1)]
        if trial % 5 == 2 and len(recs) > 2:
            at = sum(map(len, recs[:len(recs) // 2]))
            buf = buf[:at + 8] + (1 << 20).to_bytes(4, "little" if e == "<" else "big") + buf[at + 12:]
        want, used = _walk(buf, 0, e, 262144, 1 << 30)
        b = np.frombuffer(buf, np.uint8)
        o = 0
        while o < used:
            got, stop = _chain(b, o, e, 262144)
            found += len(got)
            assert len(got) and got.tolist() == [a for a in want.tolist() if o <= a < stop]
            assert stop in want or stop == used
            o = stop
    assert found > 2000
    recs = _pcap_records(random.Random(8), e, 5000, 0x6A123456, inner=0)
    plain = b"".join(recs)
    got, stop = _chain(np.frombuffer(plain[:-3], np.uint8), 0, e, 262144)
    assert len(got) == 4999 and stop == len(plain) - len(recs[-1])


def test_batches_of_payloads_that_hold_records(tmp_path):
    """A pcap file whose packets carry pcap records (the chain at C speed gives up on such chunks): the reader's
    packets, in batches of any size."""
    import random
    import struct
    rnd = random.Random(9)
    path = tmp_path / "inner.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)
                     + b"".join(_pcap_records(rnd, "<", 3000, 0x6A123456)))
    recs, err = _records(path)
    assert err is None and len(recs) == 3000
    for size in (1, 7, 65536):
        rows, err = _rows(path, size)
        assert err is None and rows == [(r.ts_ns, r.data, r.orig_len, r.linktype, r.iface) for r in recs]


def _block(btype: int, body: bytes) -> bytes:
    import struct
    body += bytes(-len(body) % 4)
    return struct.pack("<II", btype, len(body) + 12) + body + struct.pack("<I", len(body) + 12)


def _epb(iface: int, ts: int, data: bytes) -> bytes:
    import struct
    return _block(6, struct.pack("<IIIII", iface, ts >> 32, ts & 0xFFFFFFFF, len(data), len(data) + 5) + data)


def test_pcapng_blocks_at_c_speed_are_the_readers(tmp_path, monkeypatch):
    """Enhanced Packet Blocks whose packets hold blocks of their own (whole, or with a wrong trailing length),
    another interface's description, a custom block and statistics among them: the reader's packets, in batches of
    any size; most of them found at C speed."""
    import random
    import struct

    from fcap.files import batches as module
    rnd = random.Random(10)
    shb = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    idb = _block(1, struct.pack("<HHI", 1, 0, 0))
    blocks = [shb, idb]
    for i in range(4000):
        data = rnd.randbytes(rnd.choice((0, 3, 60, 300)))
        if i % 5 == 0:
            fake = _epb(0, i, rnd.randbytes(8))
            data = bytes(4 * rnd.randrange(3)) + (fake if i % 10 else fake[:-4] + b"\xff\xff\xff\xff") + data
        blocks.append(_epb(i >= 2000, 1_700_000_000_000_000 + i, data))
        if i == 1999:
            blocks.append(_block(1, struct.pack("<HHI", 101, 0, 0)))
        elif i in (500, 3000):
            blocks.append(_block(0x40000BAD, struct.pack("<I", 32473) + b"x" * i))
            blocks.append(_block(5, struct.pack("<III", 0, 0, 0)))
    path = tmp_path / "blocks.pcapng"
    path.write_bytes(b"".join(blocks))
    recs, err = _records(path)
    assert err is None and len(recs) == 4000
    runs = []
    run = module._epb_run

    def spied(w, n, start):
        found = run(w, n, start)
        runs.append(0 if found is None else len(found))
        return found

    monkeypatch.setattr(module, "_epb_run", spied)
    for size in (1, 7, 65536):
        rows, err = _rows(path, size)
        assert err is None and rows == [(r.ts_ns, r.data, r.orig_len, r.linktype, r.iface) for r in recs]
    assert sum(runs) > 3 * 3000
