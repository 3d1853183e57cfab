"""Fuzzing what fcap reads from others, with hypothesis: capture files (`fcap -r`) and BTF blobs (the kernel's types).

Each target takes real inputs, damages them (cuts, changed bytes, length words set to 0, 2^32-1 and the like,
inserted, deleted and repeated ranges) and checks the contract:

- capture files: the reader yields records or raises PcapFormatError, holding no more memory than a few times
  the file's size (a 4 GB length field allocates nothing); `fcap -r FILE [flags]` then prints what it could,
  exits 0, or 1 with exactly one line "fcap: FILE: ...";
- BTF: parsing and walking every type (members, enumerators, prototypes, C declarations, the scans fcap makes),
  and fcap on top of it (list-devices, capture points resolved, capture programs built) raise BTFError or
  fcap's errors only, and never hang.

tests/test_fuzz.py runs each target for a bounded number of examples (FCAP_FUZZ_EXAMPLES, default 150). Longer:

    python3 -m tests.fuzz --minutes 10 [--target capture|btf]

A failure prints hypothesis's smallest failing example and keeps the input in /tmp/fcap-fuzz-failure.bin.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import struct
import sys
import tempfile
import time
import traceback
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:     # (run as python3 -m tests.fuzz: the helpers beside this file)
    sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from bpf.btf import (BTF, Array, BTFError, Composite, Datasec, DeclTag, Enum, Func, FuncProto,  # noqa: E402
                     Kind, c_decl)
from fcap.commands import cli, listing as listcmd  # noqa: E402
from fcap.errors import FcapError, PcapFormatError  # noqa: E402
from fcap.files.pcapread import read  # noqa: E402
from corpus import CAPTURES as CORPUS  # noqa: E402

VMLINUX = "/sys/kernel/btf/vmlinux"
FAILURE = Path(tempfile.gettempdir()) / "fcap-fuzz-failure.bin"
HANG_S = 20
INTERESTING = (0, 1, 3, 4, 7, 8, 12, 16, 28, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
               0xFFFFFFF0, 0xFFFFFFFF)
PRINT_FLAGS = ([], ["-e"], ["-A"], ["-x"], ["-X"], ["-xx"], ["-XX"], ["-AA"], ["-S"], ["-t"], ["-tt"], ["-ttt"],
               ["-tttt"], ["-ttttt"], ["--nano", "-e", "-ttt"], ["--count"], ["-c", "2"], ["-e", "-A", "-S", "-K"],
               ["-v"])

last_input = b""
examples = {"capture": 0, "btf": 0}


class Hang(Exception):
    """A target took longer than HANG_S seconds on one input."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def on_alarm(signum, frame):
        raise Hang(f"no answer after {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@st.composite
def damaged(draw, bases: list[bytes], most: int = 4) -> bytes:
    """One of `bases` with 1..most changes."""
    blob = bytearray(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, most))):
        if not blob:
            break
        op = draw(st.sampled_from(("cut", "byte", "word", "word", "insert", "delete", "repeat")))
        i = draw(st.integers(0, len(blob) - 1))
        if op == "cut":
            del blob[i:]
        elif op == "byte":
            blob[i] = draw(st.integers(0, 255))
        elif op == "word":   # a length, count, offset or id field set to something a parser must survive
            if draw(st.booleans()):
                i -= i % 4
            value = draw(st.sampled_from(INTERESTING + (len(blob), len(blob) - i, len(blob) - i + 4)))
            order = draw(st.sampled_from(("little", "big")))
            blob[i:i + 4] = (value & 0xFFFFFFFF).to_bytes(4, order)
        elif op == "insert":
            blob[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del blob[i:i + draw(st.integers(1, 64))]
        else:   # a range repeated: more blocks, more interfaces, more types than anyone wrote
            n = draw(st.integers(1, 256))
            blob[i:i] = bytes(blob[i:i + n]) * draw(st.integers(1, 16))
    return bytes(blob)


# ---------------------------------------------------------------------------------------------- capture files

def capture_bases() -> list[bytes]:
    """Real files (tcpdump's test captures, fcap's pcaps/) cut to 4 KB, and files fcap's writers make."""
    bases = [written_pcapng(), written_pcap()]
    files = sorted(CORPUS.glob("*.pcap*")) if CORPUS.is_dir() else []
    files += sorted((HERE.parent / "pcaps").glob("*.pcap*"))
    for f in files:
        with open(f, "rb") as fh:
            bases.append(fh.read(4096))
    return bases


def written_pcapng() -> bytes:
    """Two sections, several interfaces and link types, packets with every option fcap writes."""
    from fcap.files.pcapfile import PcapngWriter
    out = b""
    for section in range(2):
        b = io.BytesIO()
        w = PcapngWriter(b, closefd=False)
        w.add_interface("tp_btf/net_dev_queue", 1, 262144, "void net_dev_queue(struct sk_buff *skb)")
        w.add_interface("fentry/ip_rcv", 276, 96)
        eth = bytes.fromhex("ffffffffffff0200000000010800") + udp4(b"x" * 20)
        w.write(1_700_000_000_000_000_001 + section, eth, len(eth), 0, 2, "pid=1 comm=ping", 0xFFFF888012345678)
        sll2 = bytes.fromhex("0800000000000001030400060200000000010000") + udp4(b"y" * 7)
        w.write(1_700_000_000_000_100_000, sll2, len(sll2) + 100, 1, 1)
        w.add_interface("tp_btf/kfree_skb", 101)
        w.write(1_700_000_000_000_200_000, udp4(b""), 28, 2, None, "dropped")
        w.close()
        out += b.getvalue()
    return out


def written_pcap() -> bytes:
    from fcap.files.pcapfile import PcapWriter
    b = io.BytesIO()
    w = PcapWriter(b, 101, 65535, closefd=False)
    for i in range(4):
        w.write(1_700_000_000_000_000_000 + i * 1000, udp4(b"z" * i * 9), 28 + i * 9 + i)
    w.close()
    return b.getvalue()


def udp4(payload: bytes) -> bytes:
    total = 28 + len(payload)
    return (bytes.fromhex("4500") + total.to_bytes(2, "big") + bytes.fromhex("00010000401100007f0000017f000001")
            + bytes.fromhex("9c400009") + (8 + len(payload)).to_bytes(2, "big") + b"\0\0" + payload)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """fcap's main() in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def check_capture(blob: bytes, flags: list[str], path: str) -> None:
    global last_input
    last_input = blob
    examples["capture"] += 1
    tracemalloc.start()
    try:
        with time_limit(HANG_S):
            try:
                for rec in read(io.BytesIO(blob)):
                    assert len(rec.data) <= len(blob) and isinstance(rec.ts_ns, int)
            except PcapFormatError as e:
                assert str(e) and "\n" not in str(e)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(blob) + (2 << 20), f"reading {len(blob)} bytes took {peak} bytes of memory"
    with open(path, "wb") as f:
        f.write(blob)
    with time_limit(HANG_S):
        rc, out, err = run_cli(["-r", path, *flags])
    lines = err.splitlines()
    if rc == 0:
        assert not lines, err
    else:
        assert rc == 1 and len(lines) == 1 and lines[0].startswith(f"fcap: {path}: "), (rc, err)


def capture_test(max_examples: int):
    bases = capture_bases()
    path = os.path.join(tempfile.mkdtemp(prefix="fcap-fuzz-"), "damaged.pcap")

    @settings(max_examples=max_examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(blob=damaged(bases), flags=st.sampled_from(PRINT_FLAGS))
    def capture_files(blob, flags):
        check_capture(blob, flags, path)
    return capture_files


# ---------------------------------------------------------------------------------------------- BTF

def small_btf_bases() -> list[bytes]:
    """The hand-built little kernels of tests/test_btf.py, in both byte orders, and hostile_btf_blobs()."""
    from test_btf import sample
    return [sample("<")[0].blob(), sample(">")[0].blob(), *hostile_btf_blobs().values()]


def hostile_btf_blobs(members: int = 1000) -> dict[str, bytes]:
    """Blobs a parser must not loop or recurse on: types that refer to themselves, long chains, a wide struct."""
    from test_btf import Enc

    def blob(build) -> bytes:
        e = Enc()
        e.int("int", 4, signed=True)   # [1]
        build(e)
        return e.blob()
    out = {
        "array of itself": lambda e: e.array(2, 1, 4),
        "var of itself": lambda e: e.add("var", "v", 0, 2, 1),
        "const/volatile loop": lambda e: (e.ref("const", 3), e.ref("volatile", 2)),
        "typedef to itself": lambda e: e.ref("typedef", 2, "t"),
        "typedef through a pointer": lambda e: (e.ref("typedef", 3, "t"), e.ref("ptr", 2)),
        "struct holding itself": lambda e: e.struct("s", 4, [("", 2, 0), ("x", 1, 0)]),
        "union holding itself anonymously": lambda e: e.struct("", 4, [("", 2, 0)], union=True),
        "function returning a pointer to itself": lambda e: (e.proto(3, [("a", 3)]), e.ref("ptr", 2),
                                                             e.func("f", 2)),
        "array of arrays of itself": lambda e: (e.array(3, 1, 2), e.array(2, 1, 2)),
        "datasec of itself": lambda e: e.add("datasec", ".data", 1, 8, 2, 0, 8),
        "decl_tag of itself": lambda e: e.add("decl_tag", "tag", 0, 2, 0xFFFFFFFF),
        "chain of 400 typedefs": lambda e: [e.ref("typedef", i + 1, f"t{i}") for i in range(1, 401)],
        "wide struct": lambda e: e.struct("wide", 4 * members, [("m", 1, 32 * i) for i in range(members)]),
        "skb pointer loop": lambda e: (e.struct("sk_buff", 8, [("next", 3, 0)]), e.ref("ptr", 2),
                                       e.func("f", e.proto(1, [("skb", 3)])),
                                       e.ref("typedef", e.ref("ptr", e.proto(0, [("", 0), ("skb", 3)])),
                                             "btf_trace_net_dev_queue")),
    }
    return {name: blob(build) for name, build in out.items()}


# which words of a record are type ids and string offsets: (fixed words, per-entry words, entry's type word,
# entry's name word), by kind
_TYPE_WORDS = {Kind.PTR: (2,), Kind.TYPEDEF: (2,), Kind.VOLATILE: (2,), Kind.CONST: (2,), Kind.RESTRICT: (2,),
               Kind.TYPE_TAG: (2,), Kind.FUNC: (2,), Kind.VAR: (2,), Kind.DECL_TAG: (2,), Kind.ARRAY: (3, 4),
               Kind.FUNC_PROTO: (2,)}
_ENTRIES = {Kind.STRUCT: (3, 1, 0), Kind.UNION: (3, 1, 0), Kind.FUNC_PROTO: (2, 1, 0), Kind.ENUM: (2, None, 0),
            Kind.ENUM64: (3, None, 0), Kind.DATASEC: (3, 0, None)}
_FIXED = {Kind.INT: 4, Kind.ARRAY: 6, Kind.VAR: 4, Kind.DECL_TAG: 4}


def vmlinux_slice(roots: list[tuple[str, str]], budget: int) -> bytes:
    """A self-contained BTF blob of the running kernel's types: `roots` (name, kind) and what they refer to,
    breadth first, up to `budget` types (references past it become void), renumbered, with their strings."""
    vm = BTF.vmlinux()
    order, index = [], {}
    todo = [t.id for name, kind in roots if (t := vm.find(name, kind)) is not None]
    while todo and len(order) < budget:
        tid = todo.pop(0)
        if tid in index or tid == 0:
            continue
        index[tid] = len(order) + 1
        order.append(tid)
        todo += _refs(vm, tid)
    strs, str_index = bytearray(b"\0"), {0: 0}

    def s(off: int) -> int:
        if off not in str_index:
            str_index[off] = len(strs)
            strs.extend(vm.string(off).encode() + b"\0")
        return str_index[off]
    words: list[int] = []
    for tid in order:
        rec = _record(vm, tid)
        kind = Kind(vm._kinds[tid - 1])
        rec[0] = s(rec[0])
        for i in _TYPE_WORDS.get(kind, ()):
            rec[i] = index.get(rec[i], 0)
        per, type_at, name_at = _ENTRIES.get(kind, (0, None, None))
        for p in range(3, len(rec), per or len(rec)):
            if type_at is not None:
                rec[p + type_at] = index.get(rec[p + type_at], 0)
            if name_at is not None:
                rec[p + name_at] = s(rec[p + name_at])
        words += rec
    types = struct.pack(f"<{len(words)}I", *words)
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strs)) + types + bytes(strs)


def _record(vm: BTF, tid: int) -> list[int]:
    o = vm._offs[tid - 1]
    kind = Kind(vm._kinds[tid - 1])
    per = {Kind.STRUCT: 3, Kind.UNION: 3, Kind.ENUM: 2, Kind.FUNC_PROTO: 2, Kind.DATASEC: 3, Kind.ENUM64: 3}
    n = _FIXED.get(kind, 3) + (vm.words[o + 1] & 0xFFFF) * per.get(kind, 0)
    return list(vm.words[o:o + n])


def _refs(vm: BTF, tid: int) -> list[int]:
    rec, kind = _record(vm, tid), Kind(vm._kinds[tid - 1])
    out = [rec[i] for i in _TYPE_WORDS.get(kind, ())]
    per, type_at, _ = _ENTRIES.get(kind, (0, None, None))
    if type_at is not None:
        out += [rec[p + type_at] for p in range(3, len(rec), per)]
    return out


def vmlinux_bases() -> list[bytes]:
    """Slices of the running kernel's BTF around what fcap reads: the skb, a device tracepoint, functions."""
    if not os.path.exists(VMLINUX):
        return []
    return [vmlinux_slice([("btf_trace_net_dev_queue", "typedef"), ("sk_buff", "struct"), ("net_device", "struct"),
                           ("ip_output", "func"), ("ip_rcv", "func")], 700),
            vmlinux_slice([("btf_trace_kfree_skb", "typedef"), ("sk_buff", "struct"), ("task_struct", "struct")], 400),
            vmlinux_slice([("btf_trace_netif_receive_skb", "typedef"), ("sk_buff", "struct")], 150)]


def walk(btf: BTF) -> None:
    """Everything a user of bpf.btf can ask of every type; only BTFError may come out."""
    for i in range(len(btf) + 1):
        with contextlib.suppress(BTFError):
            _ask(btf.type(i))
        with contextlib.suppress(BTFError):
            btf.kind_of(i)
    for op in (lambda: btf.funcs_taking_pointer_to("sk_buff"), lambda: btf.typedefs_to_func_proto("btf_trace_"),
               lambda: btf.find("sk_buff", "struct"), lambda: btf.find_all("int"), lambda: list(btf.funcs()),
               lambda: list(btf.types("struct"))):
        with contextlib.suppress(BTFError):
            op()


def _ask(t) -> None:
    repr(t), t.kind, t.name, t.vlen, t.kind_flag
    with contextlib.suppress(BTFError):
        t.strip()
    with contextlib.suppress(BTFError):
        t.size
    with contextlib.suppress(BTFError):
        c_decl(t, "x")
    if isinstance(t, Composite):
        for m in t.members:
            repr(m), m.offset
            with contextlib.suppress(BTFError):
                m.type
        for name in [m.name for m in t.members[:3]] + ["len", "nosuch"]:
            with contextlib.suppress(BTFError):
                t.member(name)
        with contextlib.suppress(BTFError):
            t.member_path("a.b")
    elif isinstance(t, Enum):
        t.values, t.name_of(0)
    elif isinstance(t, FuncProto):
        t.params, t.variadic
        with contextlib.suppress(BTFError):
            t.ret
    elif isinstance(t, Array):
        t.nelems
        with contextlib.suppress(BTFError):
            t.elem, t.index
    elif isinstance(t, Datasec):
        [repr(v) for v in t.vars]
    elif isinstance(t, Func):
        t.linkage
        with contextlib.suppress(BTFError):
            t.proto
    elif isinstance(t, DeclTag):
        t.component_idx


@contextlib.contextmanager
def as_the_kernels(btf: BTF):
    """fcap sees `btf` as the running kernel's BTF (and no modules, and no probes of what the kernel refuses), with
    per-boot caches of its own: they are keyed by the files in /sys/kernel/btf, which still name the real kernel,
    so what fcap learns from `btf` (its point list, its name lookups) must not reach the real kernel's caches."""
    saved = BTF._vmlinux, BTF._modules, BTF.module_names, listcmd.refused_kinds, os.environ.get("XDG_CACHE_HOME")
    BTF._vmlinux, BTF._modules = btf, {}
    BTF.module_names = staticmethod(lambda: [])
    listcmd.refused_kinds = lambda: ""
    with tempfile.TemporaryDirectory(prefix="fcap-fuzz-cache-") as cache:
        os.environ["XDG_CACHE_HOME"] = cache
        try:
            yield
        finally:
            BTF._vmlinux, BTF._modules, BTF.module_names, listcmd.refused_kinds, xdg = saved
            if xdg is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = xdg


def fcap_on(btf: BTF) -> None:
    """fcap's own uses of the kernel's BTF: list-devices (one line at most on failure), capture points resolved
    and their programs built (fcap's errors only)."""
    from fcap.kernel import program as cprog
    from fcap.points.spec import resolve
    with as_the_kernels(btf):
        rc, _out, err = run_cli(["list-devices"])
        assert rc in (0, 1) and len(err.splitlines()) <= 1 and (rc == 0 or err.startswith("fcap: ")), (rc, err)
        for spec in ("tp_btf/net_dev_queue", "tp_btf/kfree_skb", "fentry/ip_output", "kprobe/ip_rcv"):
            try:
                p = resolve(spec)
                p.prototype()
                for start in (cprog.START_SLL2, cprog.START_MAC):
                    opts = cprog.ProgramOptions(start=start, snaplen=262144)
                    maps = cprog.Maps(events=-1, scratch=-2, counters=-3, scratch_size=cprog.scratch_size(p, opts))
                    cprog.build(p, opts, maps)
            except FcapError:
                pass


def check_btf(blob: bytes) -> None:
    global last_input
    last_input = blob
    examples["btf"] += 1
    with time_limit(HANG_S):
        try:
            btf = BTF.load(blob, name="fuzz")
        except BTFError:
            return
        walk(btf)
        fcap_on(btf)


def btf_test(max_examples: int, bases: list[bytes] | None = None):
    bases = bases if bases is not None else small_btf_bases() + vmlinux_bases()

    @settings(max_examples=max_examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(blob=damaged(bases, most=6))
    def btf_blobs(blob):
        check_btf(blob)
    return btf_blobs


# ---------------------------------------------------------------------------------------------- the long run

TARGETS = {"capture": capture_test, "btf": btf_test}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tests.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="how long to run (default 5)")
    ap.add_argument("--target", choices=(*TARGETS, "all"), default="all")
    ap.add_argument("--batch", type=int, default=300, help="examples per hypothesis run (default 300)")
    a = ap.parse_args(argv)
    names = list(TARGETS) if a.target == "all" else [a.target]
    tests = {name: TARGETS[name](a.batch) for name in names}
    start = time.monotonic()
    deadline = start + a.minutes * 60
    while time.monotonic() < deadline:
        for name, test in tests.items():
            try:
                test()
            except BaseException as e:   # noqa: BLE001 - report any failure, keep its input
                FAILURE.write_bytes(last_input)
                where = "".join(traceback.format_exception(e)[-7:])
                print(f"{where}\n{name}: FAILED after {examples[name]} examples: {type(e).__name__}: {e}\n"
                      f"  the input is in {FAILURE}", file=sys.stderr)
                return 1
        done = ", ".join(f"{n} {examples[n]}" for n in names)
        print(f"{time.monotonic() - start:6.0f} s: examples so far: {done}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
