"""The tests' own XDP and tc programs, made with fcap's BPF toolkit (asm, BTF with func_info so that fentry/fexit can
attach to them): for IPv4 UDP to `rewrite_port` they decrement the TTL and fix the header checksum (as a router
does), for `drop_port` they count the packet in a map and drop it, everything else they pass."""

from __future__ import annotations

import os
import subprocess

from bpf import asm
from bpf.asm import DW, FP, JEQ, JGT, JLT, JNE, R0, R1, R2, R3, R4, R5, R6, B, H, W
from bpf.btf_write import BTFWriter
from bpf.maps import ArrayMap
from bpf.prog import Program, load
from bpf.uapi import ProgType

# program type: (context struct in its BTF, data and data_end offsets in it, pass verdict, drop verdict)
SHAPES = {ProgType.XDP: ("xdp_md", 0, 4, 2, 1),            # XDP_PASS, XDP_DROP
          ProgType.SCHED_CLS: ("__sk_buff", 76, 80, 0, 2)}  # TC_ACT_OK, TC_ACT_SHOT


def _be16(port: int) -> int:
    """A port as a 16-bit load of its network-order bytes gives it on a little-endian machine."""
    return int.from_bytes(port.to_bytes(2, "big"), "little")


def body(prog_type: ProgType, rewrite_port: int, drop_port: int, counter_fd: int) -> list:
    _ctx, data, end, ok, drop = SHAPES[prog_type]
    return [
        asm.mov(R6, R1), asm.ldx(W, R2, R6, data), asm.ldx(W, R3, R6, end),
        asm.mov(R4, R2), asm.addi(R4, 38), asm.jmp(JGT, R4, R3, "pass", reg=True),
        asm.ldx(H, R5, R2, 12), asm.jmp(JNE, R5, 0x0008, "pass"),           # IPv4
        asm.ldx(B, R5, R2, 14), asm.jmp(JNE, R5, 0x45, "pass"),             # no IP options
        asm.ldx(B, R5, R2, 23), asm.jmp(JNE, R5, 17, "pass"),               # UDP
        asm.ldx(H, R5, R2, 36), asm.jmp(JEQ, R5, _be16(drop_port), "drop"),
        asm.jmp(JNE, R5, _be16(rewrite_port), "pass"),
        # ip_decrease_ttl(): --ttl, check += htons(0x0100) with the end-around carry
        asm.ldx(B, R5, R2, 22), asm.addi(R5, -1), asm.stx(B, R2, 22, R5),
        asm.ldx(H, R5, R2, 24), asm.addi(R5, 1), asm.jmp(JLT, R5, 0xFFFF, "no_carry"), asm.addi(R5, 1),
        asm.label("no_carry"), asm.stx(H, R2, 24, R5), asm.ja("pass"),
        asm.label("drop"), asm.st(W, FP, -4, 0), asm.ld_map_fd(R1, counter_fd), asm.mov(R2, FP), asm.addi(R2, -4),
        asm.call(1), asm.jmp(JEQ, R0, 0, "drop_ret"), asm.movi(R1, 1), asm.atomic_add(DW, R0, 0, R1),
        asm.label("drop_ret"), asm.movi(R0, drop), asm.exit_(),
        asm.label("pass"), asm.movi(R0, ok), asm.exit_(),
    ]


class TestProgram:
    """A loaded test program, its BTF and its drop counter (close() frees them)."""

    def __init__(self, prog_type: ProgType, name: str, rewrite_port: int, drop_port: int, flags: int = 0):
        w, func = BTFWriter.one_function(name, SHAPES[prog_type][0])
        self.btf = w.load()
        self.counter = ArrayMap(value_size=8, max_entries=1, name="fcap_t_drops")
        try:
            self.prog: Program = load(prog_type, body(prog_type, rewrite_port, drop_port, self.counter.fileno()),
                                      name=name, btf_fd=self.btf.fileno(), func_info=[(0, func)], prog_flags=flags)
        except BaseException:
            self.counter.close()
            self.btf.close()
            raise
        self.name = name

    def fileno(self) -> int:
        return self.prog.fileno()

    @property
    def id(self) -> int:
        return self.prog.info().id

    def drops(self) -> int:
        return int.from_bytes(self.counter.lookup(0), "little")

    def close(self) -> None:
        self.prog.close()
        self.counter.close()
        self.btf.close()


def attach_clsact(prog: TestProgram, dev: str, pin_dir: str = "/sys/fs/bpf") -> None:
    """tc programs before tcx (6.6): a clsact qdisc on `dev` and the program as its ingress filter (direct action),
    through iproute2 and a pinned copy (unpinned here: the filter holds the program; deleting `dev` frees it)."""
    from bpf.objects import pin
    path = os.path.join(pin_dir, f"fcap_test_{os.getpid()}")
    pin(prog.fileno(), path)
    try:
        subprocess.run(["tc", "qdisc", "add", "dev", dev, "clsact"], check=True, capture_output=True)
        subprocess.run(["tc", "filter", "add", "dev", dev, "ingress", "bpf", "direct-action", "object-pinned",
                        path], check=True, capture_output=True)
    finally:
        os.unlink(path)
