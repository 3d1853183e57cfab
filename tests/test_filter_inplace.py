"""The filter reading packet bytes in place through skb->head (where the verifier allows direct loads there): loads
in the first 512 bytes and past them (the slow path, which makes its own skb dynptr), on linear datagrams of many
sizes; at a device point with EN10MB (nothing made up before the bytes: read in place) and with LINUX_SLL2 (20
made-up bytes: read over the copy, as before). Both must keep exactly the datagrams libpcap's expression means."""

from __future__ import annotations

import time

import pytest
from conftest import need_root

from netns import SLOW, UDPSink, l4_payload, read_packets, send_udp, start_fcap

POINT = "tp_btf/net_dev_queue"
SIZES = (1, 64, 101, 400, 600, 2008, 2009, 3000, 9000)
NEAR, FAR = 100, 2000      # payload offsets the filter compares: in the first 512 bytes, and past them


def _payload(size: int, k: int) -> bytes:
    return bytes((i * 7 + k) & 0xFF for i in range(size))


def _byte(off: int, k: int) -> int:
    return (off * 7 + k) & 0xFF


def _slow_path_available() -> bool:
    need_root()
    from fcap.points import pointcaps
    from fcap.live.session import Config, Session
    s = Session(Config(points=[POINT]))
    s.resolve()
    return bool(pointcaps.dynptr_kfunc(s.points[0]))


@pytest.mark.parametrize("linktype", ["EN10MB", "LINUX_SLL2"])
def test_near_and_far_loads_keep_what_the_expression_means(tmp_path, linktype):
    if not _slow_path_available():
        pytest.skip("this kernel has no skb dynptr in tracing programs: loads past the copied bytes reject")
    path = tmp_path / f"inplace-{linktype}.pcap"
    with UDPSink() as sink:
        expr = (f"udp dst port {sink.port} and udp[{8 + NEAR}] = {_byte(NEAR, 1)} "
                f"and udp[{8 + FAR}] = {_byte(FAR, 1)}")
        fc = start_fcap(["-i", POINT, "-y", linktype, "-w", str(path), expr])
        try:
            for k in (1, 2):
                send_udp("127.0.0.1", sink.port, [_payload(n, k) for n in SIZES])
            sink.wait(2 * len(SIZES))
            time.sleep(0.3 * SLOW)
        finally:
            assert fc.stop() == 0, fc.stderr
    got = sorted((len(l4_payload(p)), l4_payload(p)) for p in read_packets(path))
    # kept: k = 1 (byte NEAR matches) and long enough to have byte FAR; the bytes as sent
    want = sorted((n, _payload(n, 1)) for n in SIZES if n > FAR)
    assert [n for n, _ in got] == [n for n, _ in want], f"{linktype}: kept sizes {[n for n, _ in got]}"
    assert got == want


# The filter as it was before issue 42: the in-place path jumps into the copy's translation, so that its loads are
# reached through skb->head (untrusted memory) and through the scratch map value. Run as fcap's command with that
# one change; argv[1] "unchecked" also lets the program past fcap's own pointer-kind check, to the kernel.
MIXED_SHAPE = r"""
import sys
from bpf import asm, prog
from fcap.kernel import filter

translated = filter._translated


def shared(b, f, prefix, cap, slow):
    if prefix.startswith("flti"):
        b.emit(asm.ja("flt_shared"))
        return
    b.emit(asm.label("flt_shared"))
    translated(b, f, prefix, cap, slow)


filter._translated = shared
if sys.argv.pop(1) == "unchecked":
    load = prog.load
    prog.load = lambda *a, **kw: load(*a, **dict(kw, check_kinds=False))
from fcap.commands.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _need_in_place() -> None:
    need_root()
    from fcap.points import pointcaps
    from fcap.live.session import Config, Session
    s = Session(Config(points=[POINT]))
    s.resolve()
    if not pointcaps.head_loads(s.points[0]):
        pytest.skip("this kernel's verifier does not type skb->head: no filter in place, nothing mixed")


def _capture_with_mixed_shape(tmp_path, checked: bool):
    """fcap with the mixed filter, 2 of 3 datagrams kept: (exit status, stderr, the kept payloads)."""
    import sys
    from netns import Proc
    path = tmp_path / "mixed.pcap"
    with UDPSink() as sink:
        expr = f"udp dst port {sink.port} and udp[{8 + NEAR}] = {_byte(NEAR, 1)}"
        fc = Proc([sys.executable, "-c", MIXED_SHAPE, "checked" if checked else "unchecked", "-i", POINT, "-c", "2",
                   "-w", str(path), expr], name="fcap")
        try:
            fc.wait_for(r"^listening on ")
            send_udp("127.0.0.1", sink.port, [_payload(400, 2), _payload(400, 1), _payload(600, 1)])
            sink.wait(3)
            status = fc.wait()
        finally:
            fc.kill()
    return status, fc.stderr, [l4_payload(p) for p in read_packets(path)]


def test_a_mixed_program_is_refused_before_the_kernel_sees_it_and_the_copy_loads_instead(tmp_path):
    """fcap's own pointer-kind check refuses the mixed shape on every kernel; the capture then takes the conservative
    variant (the filter over the copy), says so in one line, and keeps exactly what the expression means."""
    _need_in_place()
    status, err, kept = _capture_with_mixed_shape(tmp_path, checked=True)
    assert status == 0, err
    notes = [ln for ln in err.splitlines() if "note:" in ln]
    assert len(notes) == 1 and "from a copy" in notes[0] and "mem_untrusted" in notes[0], err
    assert kept == [_payload(400, 1), _payload(600, 1)]


def test_a_kernel_that_refuses_the_mixed_program_gets_the_copy(tmp_path):
    """Past fcap's check, the kernel's verifier decides: where it refuses a load reached through two kinds of
    pointer (this host's 6.18.44 build), the capture falls back to the copy in one line; where it takes the mixed
    program (older verifiers), that program runs and filters alike."""
    _need_in_place()
    status, err, kept = _capture_with_mixed_shape(tmp_path, checked=False)
    assert status == 0, err
    notes = [ln for ln in err.splitlines() if "note:" in ln]
    assert len(notes) <= 1, err
    if notes:
        assert "from a copy" in notes[0] and "different pointers" in notes[0], err
    assert kept == [_payload(400, 1), _payload(600, 1)]
