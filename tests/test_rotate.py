"""-C/-G/-W without a kernel: tcpdump's file names, and the rotating writer cutting batches of whole records (as
the drains hand them over: one buffer per record, three per pcapng block, or ring spans cut anywhere) into files
that each read back whole, with every record once, in order."""

from __future__ import annotations

import io
import os
import random
import subprocess
import time

import pytest

from fcap.files.pcapfile import open_writer
from fcap.files.pcapread import read
from netns import EXIT_TIMEOUT, fcap_argv, read_packets, send_udp, start_fcap, subprocess_env
from packets import summary
from fcap.files.rotate import RotationPlan, RotatingWriter, file_name


@pytest.mark.parametrize("files,chars", [(0, 0), (1, 0), (2, 1), (10, 1), (11, 2), (100, 2), (101, 3), (1000, 3)])
def test_counter_digits_are_tcpdumps(files, chars):
    """tcpdump's getWflagChars: the digits of N - 1."""
    assert RotationPlan(size=1, files=files).chars == chars


@pytest.mark.parametrize("count,chars,name", [(0, 0, "x"), (1, 0, "x1"), (12, 0, "x12"), (0, 1, "x0"),
                                              (2, 1, "x2"), (3, 2, "x03"), (0, 3, "x000")])
def test_names_are_tcpdumps(count, chars, name):
    """MakeFilename: "%s%0*d", except for the first file when there is nothing to pad."""
    assert file_name("x", count, chars, None) == name


def test_strftime_names_in_local_time():
    t = int(time.mktime((2024, 2, 3, 4, 5, 6, 0, 0, -1)))
    assert file_name("cap-%Y%m%d-%H%M%S.pcap", 0, 0, t) == "cap-20240203-040506.pcap"
    assert file_name("cap-%H%M%S-", 2, 1, t) == "cap-040506-2"


def _records(fmt: str, n: int, seed: int) -> list[bytes]:
    """n records of random sizes, laid out by fcap's writer of fmt (pcapng with options on some)."""
    rnd = random.Random(seed)
    buf = io.BytesIO()
    w = open_writer(buf, fmt)
    w.add_interface("p", 1, 65535)
    start = buf.tell()
    ends = []
    for i in range(n):
        data = i.to_bytes(4, "big") + rnd.randbytes(rnd.randint(0, 1500))
        if fmt == "pcapng" and i % 3 == 0:
            w.write(i * 1000, data, len(data) + 7, flags=1, comment="c" * (i % 11), packet_id=i)
        else:
            w.write(i * 1000, data, len(data))
        ends.append(buf.tell())
    blob = buf.getvalue()
    return [blob[a:b] for a, b in zip([start] + ends[:-1], ends)]


def _batches(records: list[bytes], how: str, rnd: random.Random) -> list[list]:
    """The records as the drains batch them: per record (FileDrain pcap), three parts per block (FileDrain
    pcapng), or a ring span of whole records in one or two buffers cut at any byte (RingDrain)."""
    out, i = [], 0
    while i < len(records):
        k = rnd.randint(1, 40)
        recs = records[i:i + k]
        i += k
        if how == "each":
            out.append([memoryview(r) for r in recs])
        elif how == "parts":
            out.append([p for r in recs for p in (r[:8], memoryview(r)[8:-4], r[-4:])])
        else:
            span = b"".join(recs)
            cut = rnd.randint(0, len(span))
            out.append([memoryview(span)[:cut], memoryview(span)[cut:]] if cut else [memoryview(span)])
    return out


def _start(fmt):
    def start(f):
        w = open_writer(f, fmt)
        w.add_interface("p", 1, 65535)
        return w
    return start


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("how", ["each", "parts", "ring"])
def test_size_rotation_cuts_only_between_records(tmp_path, fmt, how):
    """-C: each file starts a record only while it is not larger than the limit (tcpdump's test before each
    packet); every file reads back whole; together they hold every record once, in order."""
    rnd = random.Random(f"{fmt}{how}")
    records = _records(fmt, 400, 1)
    limit = 20_000
    w = RotatingWriter(str(tmp_path / "x"), RotationPlan(size=limit), fmt, _start(fmt))
    for batch in _batches(records, how, rnd):
        w.writev(batch)
    w.close()
    assert w.paths == [str(tmp_path / "x")] + [str(tmp_path / f"x{i}") for i in range(1, len(w.paths))]
    assert len(w.paths) > 10
    got, pos = [], 0
    for k, path in enumerate(w.paths):
        recs = list(read(path))
        got += [int.from_bytes(r.data[:4], "big") for r in recs]
        size = os.path.getsize(path)
        pos += len(recs)
        # the last record started while the file was at most `limit` bytes; then it was past
        assert size - len(records[pos - 1]) <= limit, path
        if k < len(w.paths) - 1:
            assert size > limit, f"{path}: rotated at {size} bytes, not past {limit}"
    assert got == list(range(len(records)))


def test_ring_of_files_reuses_the_oldest(tmp_path):
    """-C with -W 3: x0, x1, x2, x0, ...: exactly three files, the newest records in them."""
    records = _records("pcap", 300, 2)
    w = RotatingWriter(str(tmp_path / "x"), RotationPlan(size=30_000, files=3), "pcap", _start("pcap"))
    for r in records:
        w.writev([r])
    w.close()
    assert [os.path.basename(p) for p in w.paths] == ["x0", "x1", "x2"] and w.opened > 4
    assert sorted(os.listdir(tmp_path)) == ["x0", "x1", "x2"]
    kept = sorted(int.from_bytes(r.data[:4], "big") for p in ("x0", "x1", "x2") for r in read(str(tmp_path / p)))
    assert kept == list(range(kept[0], len(records)))


def test_interval_rotation_and_the_last_file(tmp_path, monkeypatch):
    """-G 10 -W 2 on a fake clock: a new file named by its interval's start, then the end after the second."""
    now = [1_700_000_000]
    monkeypatch.setattr(time, "time", lambda: now[0])
    w = RotatingWriter(str(tmp_path / "g-%s"), RotationPlan(seconds=10, files=2), "pcapng", _start("pcapng"))
    assert w.tick() is False and w.paths == [str(tmp_path / "g-1700000000")]
    now[0] += 9
    assert w.tick() is False and len(w.paths) == 1
    now[0] += 1
    assert w.tick() is False and w.paths[-1] == str(tmp_path / "g-1700000010")
    now[0] += 12
    assert w.tick() is True and w.tick() is True and len(w.paths) == 2   # the last file stays open
    w.writev([b"" + _records("pcapng", 1, 3)[0]])
    w.close()
    assert len(list(read(w.paths[-1]))) == 1


def test_a_file_that_cannot_be_opened_fails_every_later_write(tmp_path):
    """The next file cannot be created: the error names it, and later writes fail the same way (an OSError,
    which the capture loop reports in one line)."""
    records = _records("pcap", 50, 4)
    d = tmp_path / "d"
    d.mkdir()
    w = RotatingWriter(str(d / "x"), RotationPlan(size=5_000), "pcap", _start("pcap"))
    os.rename(d, tmp_path / "gone")
    with pytest.raises(OSError) as e:
        for r in records:
            w.writev([r])
    assert e.value.filename == str(d / "x1")
    with pytest.raises(FileNotFoundError):
        w.writev([records[-1]])
    w.close()


# ---- live: fcap -C/-G/-W beside tcpdump with the same flags ---------------------------------------------------

POINT = "tp_btf/net_dev_queue"
MB = 1_000_000


def _datagrams(n: int, size: int = 1400) -> list[bytes]:
    tag = os.urandom(8)
    return [tag + i.to_bytes(4, "big") + bytes(size - 12) for i in range(n)]


def _record_sizes(path: str) -> list[int]:
    """The sizes of a capture file's packet records, walking its bytes (pcap: 16-byte headers; pcapng: blocks)."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    sizes = []
    if data[:4] == b"\x0a\x0d\x0d\x0a":
        at = 0
        while at < len(data):
            btype, total = struct.unpack_from("=II", data, at)
            assert total >= 12 and at + total <= len(data), f"{path}: block at {at} runs past the end"
            if btype == 6:
                sizes.append(total)
            at += total
        return sizes
    at = 24
    while at < len(data):
        caplen = struct.unpack_from("=I", data, at + 8)[0]
        assert at + 16 + caplen <= len(data), f"{path}: record at {at} runs past the end"
        sizes.append(16 + caplen)
        at += 16 + caplen
    return sizes


def _readable(path: str) -> None:
    """tcpdump and tshark read the file without a word of complaint."""
    r = subprocess.run(["tcpdump", "-nn", "-r", path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "truncated" not in r.stderr and "cut short" not in r.stderr, (path, r.stderr)
    r = subprocess.run(["tshark", "-n", "-r", path], capture_output=True, text=True, timeout=120)
    said = [ln for ln in r.stderr.splitlines() if ln.strip() and "This could be dangerous" not in ln]
    assert r.returncode == 0 and not said, (path, r.stderr)


def _payloads(paths: list[str]) -> list[bytes]:
    return [p.l3[28:] for path in paths for p in read_packets(path)]


def _check_cut(paths: list[str], limit: int) -> None:
    """Each file's last record started while the file was at most `limit` bytes; every file but the last is
    past it (tcpdump's rule: rotate before a record when the file is already larger than the limit)."""
    for k, path in enumerate(paths):
        size = os.path.getsize(path)
        sizes = _record_sizes(path)
        assert sizes and size - sizes[-1] <= limit, f"{path}: {size} bytes, last record {sizes[-1]}"
        if k < len(paths) - 1:
            assert size > limit, f"{path}: rotated at {size} bytes"


def _through_fcap(sink, argv: list[str], pays: list[bytes], wait: bool = False):
    """fcap ARGV while pays go to the sink (paced), then stopped (or, wait: left to end by itself, as with -c);
    the fcap process, which exited with 0."""
    fc = start_fcap(argv)
    try:
        send_udp("127.0.0.1", sink.port, pays, pace=0.0002)
        sink.wait(len(pays))
        time.sleep(0.5)
        rc = _ended(fc) if wait else fc.stop()
    finally:
        fc.kill()
    assert rc == 0, fc.stderr
    return fc


def _ended(fc) -> int:
    """fcap's status once -c ended it, or, where the kernel dropped records so that -c cannot be reached (its
    buffer overflowed on a loaded machine; the summary says how many: _every_datagram_once), once SIGINT did."""
    try:
        fc.p.wait(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    return fc.stop()


def _every_datagram_once(fc, seen: list[bytes], pays: list[bytes]) -> None:
    """Each datagram in the files at most once, and all of them but those fcap says the kernel dropped: its
    summary's counts are the files' (with -c and nothing dropped: exactly the datagrams sent)."""
    n = summary(fc.stderr)
    assert len(seen) == len(set(seen)) and set(seen) <= set(pays), "a datagram twice, or one never sent"
    assert n["captured"] == len(seen) and n["captured"] + n["dropped by kernel"] == len(pays), fc.stderr


def _capture_both(sink, tmp_path, flags: list[str], name: str, pays: list[bytes], extra: list[str] = ()):
    """fcap and tcpdump with the same rotation flags, into tmp_path/fcap and tmp_path/tcpdump, on the same
    datagrams; returns (fcap's Proc, its directory, tcpdump's directory, whether tcpdump got every datagram) once
    both have stopped (a slow machine, a guest under TCG, may make tcpdump drop some)."""
    from netns import start_tcpdump
    mine, theirs = tmp_path / "fcap", tmp_path / "tcpdump"
    mine.mkdir()
    theirs.mkdir()
    td = start_tcpdump("lo", theirs / name, "-Z", "root", *flags, f"udp port {sink.port}")
    try:
        fc = _through_fcap(sink, ["-i", POINT, *extra, *flags, "-w", str(mine / name), f"udp port {sink.port}"],
                           pays, wait="-c" in extra)
    finally:
        td.stop()
        td.kill()
    return fc, mine, theirs, f"\n{len(pays)} packets captured" in "\n" + td.stderr


def _listing(d) -> list[tuple[str, int]]:
    return sorted((n, os.path.getsize(os.path.join(d, n))) for n in os.listdir(d))


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
@pytest.mark.parametrize("drain", ["file ring", "perf buffer"])
def test_size_rotation_beside_tcpdump(sink, tmp_path, tcpdump, tshark, fmt, drain):
    """-C 1 on ~3 MB: the names tcpdump gives (x, x1, x2, ...; pcap: the very sizes too), each file complete and
    readable by tcpdump and tshark, cut only between records, every packet once. The file ring path (the kernel
    lays out the records) and the perf buffer path (--perf-buffer: user space lays them out)."""
    pays = _datagrams(2200)
    extra = ["--perf-buffer", "-c", str(len(pays))] if drain == "perf buffer" else []
    name = f"x.{fmt}"
    fc, mine, theirs, complete = _capture_both(sink, tmp_path, ["-C", "1"], name, pays, extra)
    got = _listing(mine)
    want = _listing(theirs)
    paths = [str(mine / name)] + [str(mine / f"{name}{i}") for i in range(1, len(got))]
    assert sorted(os.path.basename(p) for p in paths) == [n for n, _ in got]
    if fmt == "pcap" and complete:
        assert got == want, "fcap's files differ from tcpdump's"
    else:
        assert len(got) >= len(want) >= 3
    _check_cut(paths, MB)
    for p in paths:
        _readable(p)
    _every_datagram_once(fc, _payloads(paths), pays)


def test_size_rotation_of_blocks_user_space_lays_out(sink, tmp_path, tcpdump, tshark):
    """-C 1 with --dump (user space lays out each block, the dump its own option; so with --nft: the DaemonSet's
    -C -W with --nft runs this way) and --stack: the names tcpdump's rule gives, cut only between records, every
    packet once, each file readable, each record with its dump and its stack."""
    import fcap
    pays = _datagrams(2200)
    name = "x.pcapng"
    fc, mine, theirs, _complete = _capture_both(sink, tmp_path, ["-C", "1"], name, pays,
                                                ["--dump", "skb->len", "--stack", "-c", str(len(pays))])
    got = _listing(mine)
    paths = [str(mine / name)] + [str(mine / f"{name}{i}") for i in range(1, len(got))]
    assert sorted(os.path.basename(p) for p in paths) == [n for n, _ in got] and len(got) >= 3
    _check_cut(paths, MB)
    for p in paths:
        _readable(p)
        assert all(pk.stack is not None and "skb->len" in pk.dumps for pk in fcap.read(p)), p
    _every_datagram_once(fc, _payloads(paths), pays)


def test_ring_of_three_files_beside_tcpdump(sink, tmp_path, tcpdump, tshark):
    """-C 1 -W 3 on ~5 MB: exactly x0, x1, x2 as tcpdump leaves them (same sizes), the oldest overwritten,
    each file whole."""
    pays = _datagrams(3500)
    fc, mine, theirs, complete = _capture_both(sink, tmp_path, ["-C", "1", "-W", "3"], "x", pays,
                                               ["--format", "pcap"])
    assert f"{len(pays)} packets captured" in fc.stderr, fc.stderr
    assert [n for n, _ in _listing(mine)] == [n for n, _ in _listing(theirs)] == ["x0", "x1", "x2"]
    if complete:   # the same packets: the same files
        assert _listing(mine) == _listing(theirs)
    paths = [str(mine / n) for n in ("x0", "x1", "x2")]
    for p in paths:
        _readable(p)
        assert _record_sizes(p)
    seen = _payloads(paths)
    assert len(seen) == len(set(seen)) and set(seen) < set(pays)


def _send_for(sink, seconds: float) -> list[bytes]:
    """Datagrams in bursts of 20 every 50 ms for `seconds`."""
    pays = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        burst = _datagrams(20, 300)
        send_udp("127.0.0.1", sink.port, burst)
        pays += burst
        time.sleep(0.05)
    sink.wait(len(pays))
    return pays


@pytest.mark.parametrize("fmt,extra", [("pcapng", []), ("pcap", ["-U"])])
def test_interval_rotation_names_files_by_strftime(sink, tmp_path, tcpdump, tshark, fmt, extra):
    """-G 1 -w 'x-%Y%m%d-%H%M%S.FMT': a file per second named by its start (local time), each complete; the
    packets all there once, each in the file of (about) its second."""
    template = str(tmp_path / f"x-%Y%m%d-%H%M%S.{fmt}")
    fc = start_fcap(["-i", POINT, *extra, "-G", "1", "-w", template, f"udp port {sink.port}"])
    try:
        pays = _send_for(sink, 3.5)
        time.sleep(0.3)
        rc = fc.stop()
    finally:
        fc.kill()
    assert rc == 0, fc.stderr
    names = sorted(os.listdir(tmp_path))
    assert len(names) >= 4, names
    starts = [time.mktime(time.strptime(n, f"x-%Y%m%d-%H%M%S.{fmt}")) for n in names]
    assert starts == sorted(set(starts))
    for n, start in zip(names, starts):
        path = str(tmp_path / n)
        _readable(path)
        for p in read_packets(path):
            assert start - 1 <= p.ts_ns / 1e9 < start + 2.5, f"{n}: a packet of {time.ctime(p.ts_ns / 1e9)}"
    seen = _payloads([str(tmp_path / n) for n in names])
    assert len(seen) == len(set(seen)) and sorted(seen) == sorted(pays)


def test_interval_rotation_stops_after_w_files(sink, tmp_path, tcpdump, tshark):
    """-G 1 -W 2: two files, then the capture ends by itself with status 0 and tcpdump's line."""
    template = str(tmp_path / "x-%H%M%S")
    fc = start_fcap(["-i", POINT, "-G", "1", "-W", "2", "-w", template, f"udp port {sink.port}"])
    try:
        for _ in range(60):
            if fc.p.poll() is not None:
                break
            send_udp("127.0.0.1", sink.port, _datagrams(5, 100))
            time.sleep(0.1)
        rc = fc.wait()
    finally:
        fc.kill()
    assert rc == 0, fc.stderr
    assert "Maximum file limit reached: 2" in fc.stderr and "packets captured" in fc.stderr, fc.stderr
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2, names
    for n in names:
        _readable(str(tmp_path / n))
    assert sum(len(read_packets(str(tmp_path / n))) for n in names) > 0


def test_interval_and_size_rotation_together(sink, tmp_path, tcpdump):
    """-G 60 -C 1 -W 3: inside an interval, the -C ring with the interval's name and a padded counter (-W only
    names the files then, as tcpdump's man page says)."""
    template = str(tmp_path / "x-%Y%m%d%H%M%S-")
    pays = _datagrams(2200)
    fc = _through_fcap(sink, ["-i", POINT, "-G", "60", "-C", "1", "-W", "3", "-w", template, f"udp port {sink.port}"],
                       pays)
    names = sorted(os.listdir(tmp_path))
    stamps = {n[:-1] for n in names}
    assert len(stamps) <= 2 and {n[-1] for n in names} == set("012"), names   # the ring wrapped (~3.5 MB)
    assert "Maximum file limit" not in fc.stderr, fc.stderr
    seen = _payloads([str(tmp_path / n) for n in names])
    assert len(seen) == len(set(seen))


# ---- -Z and write errors with rotation ------------------------------------------------------------------------

@pytest.fixture
def shared_dir():
    """A directory under /tmp every user may create files in (tmp_path's ancestors are root's alone)."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="fcap-rot-")
    os.chmod(d, 0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _nobody():
    import pwd
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no user nobody")


def test_z_makes_every_rotated_file_as_the_user(sink, shared_dir):
    """-Z nobody -C 1: the first file is given to nobody, the later ones are made by nobody (as tcpdump's)."""
    nobody = _nobody()
    pays = _datagrams(2200)
    _through_fcap(sink, ["-Z", "nobody", "-i", POINT, "-C", "1", "-w", os.path.join(shared_dir, "x.pcap"),
                         f"udp port {sink.port}"], pays)
    names = sorted(os.listdir(shared_dir))
    assert len(names) >= 3 and names[0] == "x.pcap", names
    assert {os.stat(os.path.join(shared_dir, n)).st_uid for n in names} == {nobody.pw_uid}
    seen = _payloads([os.path.join(shared_dir, n) for n in names])
    assert sorted(seen) == sorted(pays)


def test_z_where_the_user_cannot_make_files_is_one_line(root, tmp_path):
    """-Z nobody -C 1 in a directory only root may write: refused at once, before anything is written."""
    _nobody()
    r = subprocess.run([*fcap_argv(), "-Z", "nobody", "-i", POINT, "-C", "1", "-w", str(tmp_path / "x")],
                       capture_output=True, timeout=60, env=subprocess_env())
    err = r.stderr.decode()
    assert r.returncode == 1 and err == f"fcap: -Z nobody: cannot create files in {tmp_path} (-C/-G make " \
                                        "their files as nobody)\n", err
    assert os.listdir(tmp_path) == []


def test_disk_filling_up_in_the_second_file(sink, tmp_path, tcpdump, tshark):
    """-C 1 on a 1.5 MB tmpfs: the second file fills it; one line naming that file, status 1, the summary, and
    both files whole (tcpdump reads them) with every record that fitted."""
    d = str(tmp_path / "mnt")
    os.mkdir(d)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", d], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.strip()}")
    try:
        fc = start_fcap(["-i", POINT, "-C", "1", "-w", os.path.join(d, "x.pcap"), f"udp port {sink.port}"])
        try:
            for _ in range(40):
                send_udp("127.0.0.1", sink.port, _datagrams(100), pace=0.0002)
                if fc.p.poll() is not None:
                    break
            rc = fc.wait()
        finally:
            fc.kill()
        assert rc == 1, fc.stderr
        lines = [ln for ln in fc.stderr.splitlines() if ln.startswith("fcap: ")]
        assert lines == [f"fcap: {d}/x.pcap1: No space left on device"], fc.stderr
        assert "packets captured" in fc.stderr and "Traceback" not in fc.stderr, fc.stderr
        assert sorted(os.listdir(d)) == ["x.pcap", "x.pcap1"]
        for n in ("x.pcap", "x.pcap1"):
            path = os.path.join(d, n)
            _readable(path)
            assert len(read_packets(path)) == len(_record_sizes(path)) > 100
    finally:
        subprocess.run(["umount", "-l", d], check=False)
