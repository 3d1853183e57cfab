"""The fuzz targets of tests/fuzz.py, bounded: FCAP_FUZZ_EXAMPLES examples each (default 150). Damaged capture
files through the reader (bounded memory) and `fcap -r` with tcpdump's printing flags (one line or none, status
0 or 1); damaged BTF (slices of this kernel's, hand-built ones) through the parser, every question its types
answer, fcap's list-devices, points and program builds (BTFError or fcap's errors only, no hang).
A longer run: python3 -m tests.fuzz --minutes N."""

from __future__ import annotations

import os

import pytest

import fuzz
from bpf.btf import BTF, BTFError, c_decl

EXAMPLES = int(os.environ.get("FCAP_FUZZ_EXAMPLES", "150"))


def test_damaged_capture_files():
    fuzz.capture_test(EXAMPLES)()


def test_damaged_btf():
    fuzz.btf_test(EXAMPLES)()


@pytest.mark.skipif(not os.path.exists(fuzz.VMLINUX), reason="this kernel has no BTF")
def test_vmlinux_slices_are_what_fcap_needs():
    """The slices the BTF target damages hold a capture point whose program builds (else the fuzz would only
    ever see parse errors)."""
    from fcap.kernel import program as cprog
    from fcap.points.spec import resolve
    btf = BTF.load(fuzz.vmlinux_bases()[0], name="slice")
    with fuzz.as_the_kernels(btf):
        p = resolve("tp_btf/net_dev_queue")
        opts = cprog.ProgramOptions(start=cprog.START_MAC, snaplen=100)
        assert cprog.build(p, opts, cprog.Maps(events=-1, scratch=-2, counters=-3))
        assert resolve("fentry/ip_output").prototype().startswith("int ip_output(struct net *net")


@pytest.mark.parametrize("name", list(fuzz.hostile_btf_blobs()))
def test_hostile_btf(name):
    """Types that refer to themselves, long chains, a wide struct: answers or BTFError, in bounded time."""
    fuzz.check_btf(fuzz.hostile_btf_blobs()[name])


def test_btf_loops_are_btf_errors():
    blobs = fuzz.hostile_btf_blobs()
    for name in ("array of itself", "array of arrays of itself", "var of itself", "const/volatile loop"):
        t = BTF.load(blobs[name]).type(2)
        with pytest.raises(BTFError, match="loop"):
            t.size
    with pytest.raises(BTFError, match="loop"):
        c_decl(BTF.load(blobs["chain of 400 typedefs"]).type(2).strip(), "x")
    with pytest.raises(BTFError, match="no such member"):
        BTF.load(blobs["struct holding itself"]).type(2).member("nosuch")


def test_wide_struct_of_65535_members():
    fuzz.check_btf(fuzz.hostile_btf_blobs(65535)["wide struct"])


def test_void_has_no_record():
    """Found by the long run: void's vlen and kind_flag read the first record's words (none in an empty type
    section: IndexError)."""
    import struct
    strs = b"\0int\0"
    empty = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, 0, 0, len(strs)) + strs
    void = BTF.load(empty).type(0)
    assert (void.vlen, void.kind_flag, void.kind) == (0, False, "void")
    fuzz.check_btf(empty)
