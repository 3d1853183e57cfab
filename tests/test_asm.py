"""Pure tests of bpf.asm: instruction encodings (as the kernel's include/uapi/linux/bpf.h lays them out), labels,
the size tables and the disassembler."""

import struct

import pytest

from bpf import asm
from bpf.asm import B, DW, FP, H, R0, R1, R3, R8, W
from bpf.errors import AsmError


def enc(*items) -> list[tuple[int, int, int, int]]:
    """(code, regs = src << 4 | dst, off, imm) of each 8-byte slot."""
    code = asm.assemble(items)
    return [struct.unpack_from("<BBhi", code, i) for i in range(0, len(code), 8)]


def test_kfunc_call():
    # BPF_JMP | BPF_CALL, src_reg BPF_PSEUDO_KFUNC_CALL (2), imm the function's BTF id
    assert enc(asm.kfunc_call(63884)) == [(0x85, 0x20, 0, 63884)]
    assert enc(asm.call(asm.Helper.ktime_get_ns)) == [(0x85, 0x00, 0, 5)]
    assert asm.format_insn(asm.kfunc_call(63884)) == "call kfunc#63884"
    assert asm.format_insn(asm.call(5)) == "call bpf_ktime_get_ns#5"


def test_arsh():
    assert enc(asm.arshi(R8, 56)) == [(0xC7, 0x08, 0, 56)]     # BPF_ALU64 | BPF_ARSH | BPF_K
    assert enc(asm.arsh(R8, R1)) == [(0xCF, 0x18, 0, 0)]       # BPF_ALU64 | BPF_ARSH | BPF_X
    assert asm.arshi(R8, 56) == asm.alu64(asm.ARSH, R8, 56)
    assert asm.format_insn(asm.arshi(R8, 56)) == "r8 s>>= 0x38"
    assert asm.format_insn(asm.arsh(R8, R1)) == "r8 s>>= r1"


def test_size_tables():
    assert asm.SIZE_BYTES == {B: 1, H: 2, W: 4, DW: 8}
    assert asm.BYTES_SIZE == {1: B, 2: H, 4: W, 8: DW}
    assert [enc(asm.ldx(asm.BYTES_SIZE[n], R0, R1, 4))[0][0] for n in (1, 2, 4, 8)] == [0x71, 0x69, 0x61, 0x79]
    assert not hasattr(asm, "xadd")     # fetch_add is the atomic add the toolkit builds


def test_other_encodings():
    assert enc(asm.movi(R0, -1), asm.mov(R3, FP), asm.addi(R3, -16)) == [
        (0xB7, 0x00, 0, -1), (0xBF, 0xA3, 0, 0), (0x07, 0x03, 0, -16)]
    assert enc(asm.stx(W, FP, -8, R1), asm.st(H, FP, -4, 7)) == [(0x63, 0x1A, -8, 0), (0x6A, 0x0A, -4, 7)]
    assert enc(asm.fetch_add(DW, R0, 8, R1)) == [(0xDB, 0x10, 8, 0x01)]
    assert enc(asm.store_release(DW, R8, 0, R1)) == [(0xDB, 0x18, 0, 0x110)]   # BPF_STORE_REL
    assert enc(asm.ld_imm64(R1, 0x1122334455667788)) == [(0x18, 0x01, 0, 0x55667788), (0, 0, 0, 0x11223344)]
    assert enc(asm.ld_map_fd(R1, 5)) == [(0x18, 0x11, 0, 5), (0, 0, 0, 0)]
    assert enc(asm.be(R8, 16), asm.exit_()) == [(0xDC, 0x08, 0, 16), (0x95, 0, 0, 0)]


def test_labels():
    items = [asm.jmp(asm.JEQ, R0, 0, "out"), asm.ld_imm64(R1, 1), asm.ja("out"), asm.label("out"), asm.exit_()]
    assert [(c, o) for c, _, o, _ in enc(*items)] == [(0x15, 3), (0x18, 0), (0, 0), (0x05, 0), (0x95, 0)]
    with pytest.raises(AsmError, match="unknown label"):
        asm.assemble([asm.ja("nowhere")])
    with pytest.raises(AsmError, match="duplicate"):
        asm.assemble([asm.label("a"), asm.label("a")])
    with pytest.raises(AsmError, match="multiple of 8"):
        asm.decode(b"\0" * 12)


def test_decode_round_trip_and_listing():
    items = [asm.ldx(DW, R1, R1, 8), asm.kfunc_call(7), asm.ld_map_value(R1, 4, 16), asm.arshi(R8, 3),
             asm.jmp32(asm.JNE, R0, 0, 1), asm.fetch_add(W, R1, 0, R0),
             asm.store_release(DW, R8, 0, R1), asm.exit_()]
    code = asm.assemble(items)
    assert asm.decode(code) == items
    assert asm.disassemble(code).splitlines() == [
        "    0: r1 = *(u64 *)(r1 +8)", "    1: call kfunc#7", "    2: r1 = map[fd:4][0]+16", "    4: r8 s>>= 0x3",
        "    5: if w0 != 0x0 goto +1", "    6: r0 = atomic_fetch_add((u32 *)(r1 +0), r0)",
        "    7: store_release((u64 *)(r8 +0), r1)", "    8: exit"]
