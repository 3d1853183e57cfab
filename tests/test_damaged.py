"""Hostile input, case by case: crafted and cut capture files given to `fcap -r` next to `tcpdump -r` (the packets
before the damage, then one line in libpcap's words, the same exit status), lengths of 4 GB that must allocate
nothing, and a corrupt kernel BTF under list-devices, info and -i (one line). tests/test_fuzz.py does the same at
random."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tracemalloc
from pathlib import Path

import pytest

import fuzz
from bpf.btf import BTF
from fcap.errors import PcapFormatError
from fcap.files.pcapread import read
from corpus import CAPTURES as CORPUS
from netns import fcap_argv
from test_pcapfile import block, epb, idb, opt, pcap_blob, shb

TCPDUMP = shutil.which("tcpdump")
need_tcpdump = pytest.mark.skipif(TCPDUMP is None, reason="tcpdump is not installed")
L = "<"
UDP = bytes.fromhex("020000000002020000000001080045000020000100004011" "7cca7f0000017f000001"
                    "9c4000090000000000000000")
PCAP = 0xA1B2C3D4


def P(recs, **kw) -> bytes:
    return pcap_blob(L, PCAP, recs, **kw)


# name: (file, whether fcap says it in tcpdump's very words). Each is damaged where tcpdump also fails.
DAMAGED = {
    "empty file": (b"", True),
    "3 bytes": (b"\xd4\xc3\xb2", True),
    "short pcap header": (P([])[:20], False),                   # (libpcap counts the bytes after the magic)
    "unknown magic": (b"GIF89a" + bytes(30), True),
    "pcap version 3.4": (P([], major=3), True),
    "pcap version 1.4": (P([], major=1), True),
    "record header cut": (P([(0, 0, UDP, len(UDP))] * 2)[:24 + 16 + len(UDP) + 7], True),
    "record data cut": (P([(0, 0, UDP, len(UDP))] * 2)[:-5], True),
    "caplen 4 GB": (P([(0, 0, UDP, len(UDP))]) + struct.pack("<IIII", 0, 0, 0xFFFFFFF0, 1), True),
    "caplen past the maximum": (P([], snaplen=20) + struct.pack("<IIII", 0, 0, 300000, 300000) + bytes(64), True),
    "pcapng block header cut": (shb(L) + idb(L, 1) + epb(L, 0, 0, UDP) + b"\x06\0\0", True),
    "pcapng block cut": (shb(L) + idb(L, 1) + epb(L, 0, 0, UDP) + epb(L, 0, 0, UDP)[:-9], True),
    "block length 8": (shb(L) + struct.pack("<II", 6, 8), True),
    "block length 21": (shb(L) + struct.pack("<II", 6, 21) + bytes(13), True),
    "block length 4 GB": (shb(L) + idb(L, 1) + struct.pack("<II", 6, 0xFFFFFFF0), False),   # (maximum differs)
    "trailer differs": (shb(L) + idb(L, 1)[:-4] + struct.pack("<I", 99), True),
    "packet before any interface": (shb(L) + epb(L, 0, 0, UDP), True),
    "packet on interface 3 of 1": (shb(L) + idb(L, 1) + epb(L, 3, 0, UDP), True),
    "caplen past its block": (shb(L) + idb(L, 1) + block(L, 6, struct.pack("<IIIII", 0, 0, 0, 99, 99) + b"ab\0\0"),
                              True),
    "interface option past its block": (shb(L) + idb(L, 1, struct.pack("<HH", 2, 200)), True),
    "if_tsresol of 2 bytes": (shb(L) + idb(L, 1, opt(L, 9, b"\x06\x06")) + epb(L, 0, 0, UDP), True),
    "if_tsresol 10^-127": (shb(L) + idb(L, 1, opt(L, 9, b"\x7f")) + epb(L, 0, 1, UDP), True),
    "if_tsresol 2^-64": (shb(L) + idb(L, 1, opt(L, 9, b"\xc0")) + epb(L, 0, 1, UDP), True),
    "short interface block": (shb(L) + block(L, 1, bytes(4)), True),
    "short packet block": (shb(L) + idb(L, 1) + block(L, 6, bytes(8)), True),
    "interface in the other byte order": (shb("<") + idb(">", 1), False),
    "pcapng version 2.0": (block(L, 0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 2, 0, -1)), True),
    "simple packet before any interface": (shb(L) + block(L, 3, struct.pack("<I", 1) + b"x\0\0\0"), True),
    "second section cut": (shb(L) + idb(L, 1) + epb(L, 0, 0, UDP) + shb(L)[:10], False),
}

# readable files: what tcpdump prints (or refuses where libpcap is stricter than it need be), fcap prints
READABLE = {
    "caplen above snaplen (cut to it, as libpcap)": P([(0, 0, UDP, len(UDP))], snaplen=20),
    "caplen above len": P([(0, 0, UDP, 10)]),
    "snaplen 0": P([(0, 0, UDP, len(UDP))], snaplen=0),
    "zero lengths": P([(0, 0, b"", 0), (0, 0, b"", 60)]),
    "if_tsresol 10^-3, 10^-10, 2^-63": b"".join(
        [shb(L)] + [idb(L, 1, opt(L, 9, bytes([v]))) for v in (3, 10, 0xBF)]
        + [epb(L, i, 123456789, UDP) for i in range(3)]),
    "unknown blocks": shb(L) + idb(L, 1) + block(L, 0x1234, b"abcd") + block(L, 0x40000BAD, b"") + epb(L, 0, 0, UDP),
    "5000 interfaces": shb(L) + idb(L, 1) * 5000 + epb(L, 4999, 0, UDP),
    "big-endian pcapng": shb(">") + idb(">", 1) + epb(">", 0, 0, UDP),
    "packet options past their block (libpcap reads none)": shb(L) + idb(L, 1) + epb(
        L, 0, 0, UDP, options=struct.pack("<HH", 1, 200)),
    "statistics for an unknown interface": shb(L) + idb(L, 1) + block(L, 5, struct.pack("<IIII", 7, 0, 0, 0)),
}
# tcpdump refuses these whole; fcap reads them (nothing in them is damaged)
FCAP_READS_MORE = {
    "an unknown link type": shb(L) + idb(L, 60000) + epb(L, 0, 0, UDP),
    "interfaces of two link types": shb(L) + idb(L, 1) + idb(L, 101) + epb(L, 0, 0, UDP) + epb(L, 1, 0, UDP[14:]),
    "caplen above the interface's snaplen": shb(L) + idb(L, 1, snaplen=20) + epb(L, 0, 0, UDP),
}


def tcpdump_r(path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([TCPDUMP, "-nn", *flags, "-r", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)


def their_error(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("reading from file")]
    assert len(lines) == 1, r.stderr
    return lines[0].removeprefix("tcpdump: ").removeprefix("pcap_loop: ")


@need_tcpdump
@pytest.mark.parametrize("name", list(DAMAGED))
def test_damaged_file_like_tcpdump(tmp_path, name):
    """The packets before the damage, then one line saying what is wrong and where; status 1, as tcpdump."""
    blob, same_words = DAMAGED[name]
    path = tmp_path / "damaged"
    path.write_bytes(blob)
    theirs = tcpdump_r(path)
    rc, out, err = fuzz.run_cli(["-r", str(path)])
    assert (rc, out) == (theirs.returncode, theirs.stdout) == (1, theirs.stdout), (rc, out, theirs)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fcap: {path}: "), err
    ours = lines[0].removeprefix(f"fcap: {path}: ")
    if same_words:
        assert ours.startswith(their_error(theirs)), (ours, their_error(theirs))
    assert "Traceback" not in err


@need_tcpdump
@pytest.mark.parametrize("name", list(READABLE))
def test_readable_oddities_like_tcpdump(tmp_path, name):
    path = tmp_path / "odd"
    path.write_bytes(READABLE[name])
    theirs = tcpdump_r(path, "-x")
    assert fuzz.run_cli(["-r", str(path), "-x"]) == (theirs.returncode, theirs.stdout, "") == (0, theirs.stdout, "")


@need_tcpdump
@pytest.mark.parametrize("name", list(FCAP_READS_MORE))
def test_what_libpcap_refuses_and_fcap_reads(tmp_path, name):
    path = tmp_path / "more"
    path.write_bytes(FCAP_READS_MORE[name])
    assert tcpdump_r(path).returncode == 1
    rc, out, err = fuzz.run_cli(["-r", str(path)])
    assert rc == 0 and err == "" and len(out.splitlines()) == len(list(read(path))) > 0, (rc, out, err)


def _one_line_per_packet(limit: int = 4) -> list[Path]:
    """Real files of each format whose tcpdump output is one line per packet: fcap's own and the corpus's."""
    picked = sorted((Path(__file__).resolve().parent.parent / "pcaps").glob("*.pcap*"))
    kinds: dict[bytes, int] = {}
    for f in sorted(CORPUS.glob("*.pcap*")) if CORPUS.is_dir() else []:
        head = f.read_bytes()[:4]
        if f.stat().st_size > 20000 or kinds.get(head, 0) >= 2:
            continue
        r = tcpdump_r(f)
        try:
            n = len(list(read(f)))
        except PcapFormatError:
            continue
        if r.returncode == 0 and n > 3 and len(r.stdout.splitlines()) == n:
            kinds[head] = kinds.get(head, 0) + 1
            picked.append(f)
    return picked[:limit + 3]


@need_tcpdump
def test_files_cut_anywhere_like_tcpdump(tmp_path):
    """Real pcap and pcapng files (both byte orders where the corpus has them) cut at 60 places each: as many
    packet lines as tcpdump prints, and its exit status (a cut between two records cannot be seen: 0)."""
    files = _one_line_per_packet()
    assert len(files) >= 5
    path, checked = tmp_path / "cut", 0
    for f in files:
        blob = f.read_bytes()
        for n in sorted({len(blob) * k // 60 for k in range(60)} | {len(blob) - 1}):
            path.write_bytes(blob[:n])
            theirs = tcpdump_r(path)
            rc, out, err = fuzz.run_cli(["-r", str(path)])
            assert (rc, len(out.splitlines())) == (theirs.returncode, len(theirs.stdout.splitlines())), (f, n, err)
            assert (rc == 0) == (err == "") and len(err.splitlines()) <= 1, err
            checked += 1
    assert checked > 250


HUGE = {   # a length field says 100 MB .. 4 GB in a file of a few hundred bytes
    "pcap caplen of a D-Bus capture (128 MiB allowed)": pcap_blob(L, PCAP, [], network=231)
    + struct.pack("<IIII", 0, 0, 100_000_000, 100_000_000) + bytes(100),
    "pcapng block of 256 MiB": shb(L) + idb(L, 1) + struct.pack("<II", 6, (1 << 28) - 4) + bytes(100),
    "pcapng section header of 256 MiB": shb(L)[:4] + struct.pack("<I", (1 << 28) - 4) + shb(L)[8:] + bytes(100),
    "pcapng option of 64 KiB": shb(L) + idb(L, 1, struct.pack("<HH", 2, 0xFFFF)),
    "pcapng caplen of 4 GB": shb(L) + idb(L, 1) + block(L, 6, struct.pack("<IIIII", 0, 0, 0, 0xFFFFFFF0, 1)),
}


@pytest.mark.parametrize("name", list(HUGE))
def test_huge_lengths_allocate_nothing(name):
    tracemalloc.start()
    try:
        with pytest.raises(PcapFormatError):
            list(read(io.BytesIO(HUGE[name])))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"{peak} bytes to read {len(HUGE[name])}"


# ---- a corrupt kernel BTF --------------------------------------------------------------------------------------

@pytest.fixture
def kernel_btf(tmp_path, monkeypatch):
    """Point fcap at a BTF directory of our own: write(blob) makes its vmlinux."""
    import bpf.btf
    monkeypatch.setattr(bpf.btf, "SYSFS_BTF", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # (the per-boot caches stay the real BTF's)
    monkeypatch.setattr(BTF, "_vmlinux", None)
    monkeypatch.setattr(BTF, "_modules", {})
    monkeypatch.setattr("fcap.commands.listing.refused_kinds", lambda: "")

    def write(blob: bytes) -> None:
        (tmp_path / "vmlinux").write_bytes(blob)
        BTF._vmlinux = None
    return write


def _one_fcap_line(rc: int, err: str, start: str) -> None:
    lines = err.splitlines()
    assert rc == 1 and len(lines) == 1 and lines[0].startswith(start), (rc, err)


def test_corrupt_kernel_btf_is_one_line(kernel_btf, tmp_path):
    from test_btf import sample
    good = sample()[0].blob()
    for blob in (good[:30], b"\x34\x12" + good[2:], good[:24] + b"\xff" * (len(good) - 24)):
        kernel_btf(blob)
        rc, out, err = fuzz.run_cli(["list-devices"])
        _one_fcap_line(rc, err, "fcap: cannot read the kernel's BTF: parse vmlinux: ")
        rc, out, err = fuzz.run_cli(["info", "tp_btf/net_dev_queue"])
        _one_fcap_line(rc, err, "fcap: tp_btf/net_dev_queue: cannot read the kernel's BTF: parse vmlinux: ")
        rc, out, err = fuzz.run_cli(["-i", "tp_btf/net_dev_queue", "-w", str(tmp_path / "x.pcapng")])
        _one_fcap_line(rc, err, "fcap: tp_btf/net_dev_queue: cannot read the kernel's BTF: parse vmlinux: ")
        assert not (tmp_path / "x.pcapng").exists()


def test_kernel_btf_without_what_the_program_reads_is_one_line(kernel_btf, tmp_path, root):
    """A BTF that parses and has the tracepoint but not the structures, or the members, the capture program reads:
    one line from the program's build, before anything is loaded."""
    from test_btf import sample
    e, ids = sample()
    kernel_btf(e.blob())
    rc, out, err = fuzz.run_cli(["list-devices"])
    assert rc == 0 and "tp_btf/net_dev_queue  void net_dev_queue(struct sk_buff *skb)" in out, (rc, out, err)
    rc, out, err = fuzz.run_cli(["-i", "tp_btf/net_dev_queue", "-w", str(tmp_path / "x.pcapng")])
    _one_fcap_line(rc, err, "fcap: this kernel's BTF has no struct sk_buff or struct net_device")
    e.struct("net_device", 8, [("ifindex", ids["int"], 0)])
    kernel_btf(e.blob())
    rc, out, err = fuzz.run_cli(["-i", "tp_btf/net_dev_queue", "-w", str(tmp_path / "x.pcapng")])
    _one_fcap_line(rc, err, "fcap: tp_btf/net_dev_queue: cannot read the kernel's BTF: member struct sk_buff.")
    assert not (tmp_path / "x.pcapng").exists()


@need_tcpdump
def test_stdin_like_tcpdump(tmp_path):
    """-r - reads stdin (a pipe): whole, and cut inside a block."""
    blob = shb(L) + idb(L, 1) + epb(L, 0, 0, UDP) * 3
    for data in (blob, blob[:-9]):
        theirs = subprocess.run([TCPDUMP, "-nn", "-r", "-"], input=data, capture_output=True, timeout=60)
        ours = subprocess.run(fcap_argv() + ["-r", "-"], input=data, capture_output=True, timeout=60)
        assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout), ours.stderr
        assert len(ours.stderr.splitlines()) == (ours.returncode != 0), ours.stderr
