"""The kinds of capture point (fcap.points.kinds), pure: each kind's attributes, where a kprobe finds arguments on
x86-64 and arm64 (held to the kernel's struct pt_regs / user_pt_regs), and no module but kinds.py comparing kind
names."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from bpf.link import Link
from bpf.uapi import AttachType, ProgType
from fcap.errors import PointError
from fcap.points import kinds
from fcap.points.spec import parse

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("fentry", "fexit", "tp_btf", "raw_tp", "kprobe", "xdp.entry", "xdp.exit", "tc.entry", "tc.exit")

# name: (program type, expected attach type, typed, function, sees return, at entry, by symbol)
EXPECTED = {
    "fentry": (ProgType.TRACING, AttachType.TRACE_FENTRY, True, True, False, True, False),
    "fexit": (ProgType.TRACING, AttachType.TRACE_FEXIT, True, True, True, False, False),
    "tp_btf": (ProgType.TRACING, AttachType.TRACE_RAW_TP, True, False, False, False, False),
    "raw_tp": (ProgType.RAW_TRACEPOINT, AttachType.NONE, False, False, False, False, False),
    "kprobe": (ProgType.KPROBE, AttachType.NONE, False, True, False, True, True),
    "xdp.entry": (ProgType.TRACING, AttachType.TRACE_FENTRY, True, True, False, True, False),
    "xdp.exit": (ProgType.TRACING, AttachType.TRACE_FEXIT, True, True, True, False, False),
    "tc.entry": (ProgType.TRACING, AttachType.TRACE_FENTRY, True, True, False, True, False),
    "tc.exit": (ProgType.TRACING, AttachType.TRACE_FEXIT, True, True, True, False, False),
}


def test_every_kind_found_by_name_with_its_attributes():
    assert kinds.names() == NAMES and tuple(k.name for k in kinds.ALL) == NAMES
    for name in NAMES:
        k = kinds.get(name)
        assert isinstance(k, kinds.Kind) and str(k) == name and f"{k}/ip_output" == f"{name}/ip_output"
        assert (k.prog_type, k.attach_type, k.typed, k.function, k.sees_return, k.at_entry, k.by_symbol) == \
            EXPECTED[name], name
        assert k.family in ("", "fentry/fexit")
        for method in ("attach", "probe", "refusal", "explain", "arg_offset", "arg_count", "has_arg"):
            assert callable(getattr(k, method)), (name, method)
        assert k.attach.__annotations__["return"] in ("Link", Link)
    assert kinds.get("kretprobe") is None and kinds.get("tp") is None
    assert (kinds.FENTRY, kinds.FEXIT, kinds.TP_BTF, kinds.RAW_TP, kinds.KPROBE, kinds.XDP_ENTRY, kinds.XDP_EXIT,
            kinds.TC_ENTRY, kinds.TC_EXIT) == kinds.ALL


def test_kinds_on_bpf_programs():
    """xdp/PROG and tc/PROG name both ends; each end its own kind, its context the kernel's struct."""
    assert kinds.program_kinds("xdp") == (kinds.XDP_ENTRY, kinds.XDP_EXIT)
    assert kinds.program_kinds("tc") == (kinds.TC_ENTRY, kinds.TC_EXIT)
    assert kinds.program_kinds("tc.exit") == (kinds.TC_EXIT,) and kinds.program_kinds("fentry") == ()
    assert kinds.for_program_type(ProgType.XDP)[0] is kinds.XDP_ENTRY and kinds.for_program_type(ProgType.KPROBE) == ()
    assert (kinds.XDP_EXIT.context, kinds.TC_EXIT.context, kinds.FENTRY.context) == ("xdp_buff", "sk_buff", "sk_buff")
    assert all(k.on_program == (k in kinds.PROGRAM_WORDS["xdp"] + kinds.PROGRAM_WORDS["tc"]) for k in kinds.ALL)
    with pytest.raises(PointError, match="a BPF program's entry and exit"):
        parse("xdp/my_prog")


def test_the_grammar_maps_text_to_kind_objects():
    assert parse("fentry/ip_output:skb") == (kinds.FENTRY, "ip_output", "skb")
    assert parse("tp/net/net_dev_queue")[0] is kinds.TP_BTF
    assert parse("raw_tp/net_dev_queue")[0] is kinds.RAW_TP
    assert parse("kprobe/ip_output")[0] is kinds.KPROBE and parse("ip_output")[0] is None
    with pytest.raises(PointError, match="known: fentry, fexit, tp_btf, raw_tp, kprobe, xdp.entry, xdp.exit, "
                                         "tc.entry, tc.exit, tp"):
        parse("uprobe/x")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64", None])
def test_context_slots_are_u64_arguments_on_every_architecture(machine):
    for k in (kinds.FENTRY, kinds.FEXIT, kinds.TP_BTF, kinds.RAW_TP):
        assert [k.arg_offset(i, machine) for i in range(12)] == [8 * i for i in range(12)]
        assert k.arg_count(machine) is None and k.has_arg(40, machine)


def test_kprobe_arguments_in_the_registers():
    # x86-64: struct pt_regs { r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di ... }, arguments in di si dx cx r8 r9
    assert kinds.X86_64.arg_regs == ("di", "si", "dx", "cx", "r8", "r9")
    assert [kinds.KPROBE.arg_offset(i, "x86_64") for i in range(6)] == [112, 104, 96, 88, 72, 64]
    assert kinds.KPROBE.arg_count("x86_64") == 6 and not kinds.KPROBE.has_arg(6, "x86_64")
    # arm64: the context is struct user_pt_regs { u64 regs[31]; sp; pc; pstate }, arguments in x0..x7
    assert kinds.ARM64.regs == "user_pt_regs"
    assert [kinds.KPROBE.arg_offset(i, "aarch64") for i in range(8)] == [8 * i for i in range(8)]
    assert kinds.KPROBE.arg_count("aarch64") == 8 and kinds.KPROBE.has_arg(7, "aarch64")
    with pytest.raises(PointError, match="past the registers"):
        kinds.KPROBE.arg_offset(6, "x86_64")


def test_an_unknown_architecture_is_one_clear_error():
    with pytest.raises(PointError) as e:
        kinds.KPROBE.arg_offset(0, "riscv64")
    assert "riscv64" in str(e.value) and "x86_64" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(PointError):
        kinds.KPROBE.has_arg(0, "riscv64")
    assert kinds.FENTRY.arg_offset(1, "riscv64") == 8   # (u64 slots need no registers)


def test_this_machine_is_asked_in_one_place(monkeypatch):
    assert kinds.machine() == os.uname().machine
    monkeypatch.setattr(kinds, "machine", lambda: "aarch64")
    assert kinds.KPROBE.arg_offset(3) == 24
    monkeypatch.setattr(kinds, "machine", lambda: "x86_64")
    assert kinds.KPROBE.arg_offset(3) == 88


def _vmlinux():
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        pytest.skip("no /sys/kernel/btf/vmlinux")
    from bpf.btf import BTF
    return BTF.vmlinux()


def test_x86_64_offsets_are_the_kernels_pt_regs():
    regs = _vmlinux().find("pt_regs", "struct")
    if regs is None or not any(m.name == "di" for m in regs.members):
        pytest.skip("this kernel's struct pt_regs is not x86-64's")
    assert [regs.member(name)[1] // 8 for name in kinds.X86_64.arg_regs] == list(kinds.X86_64.arg_offsets)
    assert all(regs.member(name)[0].type.strip().size == 8 for name in kinds.X86_64.arg_regs)
    assert regs.member(kinds.X86_64.ret_reg)[1] // 8 == kinds.X86_64.ret_offset and kinds.X86_64.ret_on_stack


def _arm64_holds(vm) -> None:
    """kinds.ARM64 against an arm64 kernel's BTF: a kprobe program's context (bpf_user_pt_regs_t) is struct
    user_pt_regs, whose u64 regs[] start it; argument i is regs[i]."""
    regs = vm.find("user_pt_regs", "struct")
    assert regs is not None and kinds.ARM64.regs == regs.name
    typedef = vm.find("bpf_user_pt_regs_t", "typedef")
    assert typedef is None or typedef.strip().name == regs.name   # (the typedef: what the verifier types it as)
    member, bits = regs.member("regs")
    array = member.type.strip()
    assert array.nelems >= len(kinds.ARM64.arg_offsets) and array.elem.strip().size == 8
    assert [bits // 8 + 8 * i for i in range(len(kinds.ARM64.arg_regs))] == list(kinds.ARM64.arg_offsets)
    assert kinds.ARM64.ret_reg == "regs[30]" and array.nelems > 30 and not kinds.ARM64.ret_on_stack   # (the LR)
    assert bits // 8 + 8 * 30 == kinds.ARM64.ret_offset


def test_arm64_offsets_are_the_kernels_user_pt_regs():
    regs = _vmlinux().find("user_pt_regs", "struct")
    if regs is None:
        pytest.skip("this kernel is not arm64's (no struct user_pt_regs)")
    _arm64_holds(_vmlinux())


ARM64_SUITE = "trixie"
ARM64_PACKAGE = re.compile(r"^linux-image-[0-9.+a-z]+-cloud-arm64$")


def _arm64_kernel_btf(cache: Path) -> bytes:
    """The BTF of Debian's arm64 cloud kernel (ARM64_SUITE's newest), its .deb fetched from Debian's archive once
    (FCAP_VM_MIRROR as tests/vm/run takes it) and kept in the cache: the blob inside its Image (BTF's header magic,
    as the kernel's own .BTF section holds it). Skips where the archive cannot be reached."""
    import lzma
    import struct
    import subprocess
    import urllib.request
    mirror = os.environ.get("FCAP_VM_MIRROR", "http://deb.debian.org/debian")
    blob = cache / "arm64.btf"
    if blob.exists():
        return blob.read_bytes()
    cache.mkdir(parents=True, exist_ok=True)
    try:
        index = urllib.request.urlopen(f"{mirror}/dists/{ARM64_SUITE}/main/binary-arm64/Packages.xz", timeout=120)
        stanzas = lzma.decompress(index.read()).decode().split("\n\n")
        files = [dict(line.split(": ", 1) for line in st.splitlines() if ": " in line) for st in stanzas]
        newest = [f for f in files if ARM64_PACKAGE.match(f.get("Package", ""))][-1]
        deb = cache / "arm64.deb"
        with urllib.request.urlopen(f"{mirror}/{newest['Filename']}", timeout=300) as r:
            deb.write_bytes(r.read())
    except (OSError, IndexError) as e:
        pytest.skip(f"Debian's archive ({mirror}) gives no arm64 kernel here: {e}")
    out = cache / "arm64"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(out)], check=True, timeout=300)
    image = next(out.glob("boot/vmlinuz-*")).read_bytes()
    if image[:2] == b"\x1f\x8b":
        import gzip
        image = gzip.decompress(image)
    at = image.find(b"\x9f\xeb\x01\x00\x18\x00\x00\x00")   # magic, version 1, flags, hdr_len 24
    assert at >= 0, "no BTF in Debian's arm64 Image"
    hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<5I", image, at + 4)
    data = image[at:at + hdr_len + max(type_off + type_len, str_off + str_len)]
    blob.write_bytes(data)
    import shutil
    deb.unlink()
    shutil.rmtree(out)
    return data


def test_arm64_offsets_are_those_of_debians_arm64_kernel():
    """No arm64 machine needed: Debian's arm64 cloud kernel's own BTF (read with bpf.btf from its Image) holds
    kinds.ARM64's offsets, so a kprobe program there reads argument i from regs[i]."""
    from bpf.btf import BTF
    cache = Path(os.environ.get("FCAP_VM_CACHE") or ROOT / ".vm-cache").resolve() / "kernels" / "arm64-btf"
    vm = BTF.load(_arm64_kernel_btf(cache), name="arm64 vmlinux")
    assert any(m.name == "orig_x0" for m in vm.find("pt_regs", "struct").members)   # (arm64's, not x86-64's)
    _arm64_holds(vm)


# ---- nothing but kinds.py compares kind names ----------------------------------------------------------------

def _kind_literals(node: ast.AST) -> list[str]:
    """The kind names among a comparison operand: a string, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES]
    return []


def kind_name_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, name) of each comparison (==, !=, in, not in, is) of something with a kind name literal, and of each
    kind-name-keyed dict looked up with .get()."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                out += [(node.lineno, name) for name in _kind_literals(operand)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Dict)):
            out += [(node.lineno, k.value) for k in node.func.value.keys
                    if isinstance(k, ast.Constant) and k.value in NAMES]
    return out


def test_the_check_finds_the_old_comparisons():
    old = ('a = p.kind == "kprobe"\nb = kind in ("tp_btf", "raw_tp")\nc = "fexit" != k\n'
           'd = {"fentry": 1}.get(p.kind)\ne = key == "filter_frags"\n')
    assert kind_name_comparisons(old) == [(1, "kprobe"), (2, "tp_btf"), (2, "raw_tp"), (3, "fexit"), (4, "fentry")]


def test_no_module_but_kinds_compares_kind_names():
    found = []
    for path in sorted((ROOT / "fcap").rglob("*.py")):
        if path == ROOT / "fcap" / "points" / "kinds.py":
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {name!r}"
                  for line, name in kind_name_comparisons(path.read_text())]
    assert not found, "ask the kind (fcap.points.kinds) instead:\n" + "\n".join(found)
