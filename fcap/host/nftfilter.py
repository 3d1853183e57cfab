"""--nft's socket filter: a classic BPF program on fcap's trace socket that lets through only the nf_tables trace
events --nft needs (fcap.host.nftrace), so that the kernel queues (and fcap parses) none of the rest: a drop
verdict (a rule's verdict drop, a base chain's policy drop) and, for the drop verdicts of the same run of a chain
that carry no packet headers, the events that carry them before a drop can follow (a rule whose verdict is
continue, jump, goto or break; a chain's end before its policy). The events of a rule's or a policy's accept stay
in the kernel: a packet a rule accepts costs fcap nothing; one that reaches a base chain's end still sends that
event (the kernel does not say whether the policy that follows is drop). The program walks the message's
attributes (unrolled: cBPF jumps only forward)."""

from __future__ import annotations

import ctypes
import struct

from bpf.cbpf_plan import (C_ALU, C_JMP, C_LD, C_LDX, C_MISC, C_RET, C_ST, J_JA, J_JEQ, J_JGE, J_JSET, M_IMM,
                           M_IND, M_LEN, M_MEM, MISC_TAX, SRC_K, SRC_X, S_H, S_W)

from fcap.host import nftables as nft

SO_ATTACH_FILTER = 26
ATTRS = 24                  # attributes walked (a trace event has at most 16; more are left unread)
FIRST = 20                  # the first attribute: after nlmsghdr (16) and nfgenmsg (4)
KEEP, DROP = 0xFFFFFFFF, 0
ADD, OR, AND, LSH, RSH, SUB = 0x00, 0x40, 0x50, 0x60, 0x70, 0x10
# scratch words
OFF, TYPE, CODE, HEADERS, HAS_CODE, RAW, LEN = range(7)


class _Asm:
    """cBPF instructions with forward labels (resolved when the program ends)."""

    def __init__(self):
        self.code: list = []     # [code, jt, jf, k] with labels as strings until resolved
        self.labels: dict = {}

    def op(self, code: int, k=0, jt=0, jf=0) -> None:
        self.code.append([code, jt, jf, k if isinstance(k, str) else k & 0xFFFFFFFF])

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def resolve(self) -> bytes:
        out = []
        for i, (code, jt, jf, k) in enumerate(self.code):
            if code == C_JMP | J_JA and isinstance(k, str):
                k = self.labels[k] - i - 1
            jt, jf = (self.labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
            assert 0 <= jt < 256 and 0 <= jf < 256 and k >= 0, (i, jt, jf, k)
            out.append(struct.pack("=HBBI", code, jt, jf, k))
        return b"".join(out)


def _swap16(a: _Asm) -> None:
    """A = the 16-bit value in A read big-endian from little-endian bytes, swapped (uses X and RAW)."""
    a.op(C_ST, RAW)
    a.op(C_ALU | RSH | SRC_K, 8)
    a.op(C_MISC | MISC_TAX)
    a.op(C_LD | M_MEM, RAW)
    a.op(C_ALU | AND | SRC_K, 0xFF)
    a.op(C_ALU | LSH | SRC_K, 8)
    a.op(C_ALU | OR | SRC_X)


def _step(a: _Asm, i: int) -> None:
    """One attribute at OFF: its type's value noted, OFF moved past it; past the message's end: to "done"."""
    nxt = f"next{i}"
    a.op(C_LD | M_LEN)
    a.op(C_ALU | SUB | SRC_K, 8)                     # (the longest load reads 8 bytes past the attribute's start)
    a.op(C_LDX | M_MEM, OFF)
    a.op(C_JMP | J_JGE | SRC_X, jt=1, jf=0)           # len - 8 >= off: go on
    a.op(C_JMP | J_JA, "done")
    a.op(C_LD | S_H | M_IND, 0)                      # nla_len (little-endian)
    _swap16(a)
    a.op(C_ST, LEN)
    a.op(C_JMP | J_JGE | SRC_K, 4, jt=1, jf=0)
    a.op(C_JMP | J_JA, "done")
    a.op(C_LDX | M_MEM, OFF)
    a.op(C_LD | S_H | M_IND, 2)                      # nla_type
    _swap16(a)
    a.op(C_ALU | AND | SRC_K, nft.NLA_TYPE_MASK)
    a.op(C_LDX | M_MEM, OFF)
    a.op(C_JMP | J_JEQ | SRC_K, nft.TRACE_TYPE, jt=f"type{i}", jf=0)
    a.op(C_JMP | J_JEQ | SRC_K, nft.TRACE_VERDICT, jt=f"verdict{i}", jf=0)
    a.op(C_JMP | J_JEQ | SRC_K, nft.TRACE_POLICY, jt=f"policy{i}", jf=0)
    a.op(C_JMP | J_JEQ | SRC_K, nft.TRACE_NETWORK_HEADER, jt=f"headers{i}", jf=nxt)
    a.label(f"type{i}")
    a.op(C_LD | S_W | M_IND, 4)
    a.op(C_ST, TYPE)
    a.op(C_JMP | J_JA, nxt)
    a.label(f"verdict{i}")                           # nested: its first attribute is the code (be32)
    a.op(C_LD | M_MEM, LEN)
    a.op(C_JMP | J_JGE | SRC_K, 12, jt=0, jf=nxt)
    a.op(C_LD | S_W | M_IND, 8)
    a.op(C_JMP | J_JA, f"code{i}")
    a.label(f"policy{i}")
    a.op(C_LD | S_W | M_IND, 4)
    a.label(f"code{i}")
    a.op(C_ST, CODE)
    a.op(C_LD | M_IMM, 1)
    a.op(C_ST, HAS_CODE)
    a.op(C_JMP | J_JA, nxt)
    a.label(f"headers{i}")
    a.op(C_LD | M_IMM, 1)
    a.op(C_ST, HEADERS)
    a.label(nxt)                                     # OFF += (nla_len + 3) & ~3
    a.op(C_LD | M_MEM, LEN)
    a.op(C_ALU | ADD | SRC_K, 3)
    a.op(C_ALU | AND | SRC_K, 0xFFFFFFFC)
    a.op(C_ALU | ADD | SRC_X)
    a.op(C_ST, OFF)


def program() -> bytes:
    """The filter's instructions (struct sock_filter, packed)."""
    a = _Asm()
    for word in (TYPE, CODE, HEADERS, HAS_CODE, RAW, LEN):
        a.op(C_LD | M_IMM, 0)
        a.op(C_ST, word)
    a.op(C_LD | M_IMM, FIRST)
    a.op(C_ST, OFF)
    for i in range(ATTRS):
        _step(a, i)
    a.label("done")
    a.op(C_LD | M_MEM, HAS_CODE)
    a.op(C_JMP | J_JEQ | SRC_K, 0, jt="drop", jf=0)
    a.op(C_LD | M_MEM, TYPE)
    a.op(C_JMP | J_JEQ | SRC_K, nft.TraceType.POLICY, jt="verdict", jf=0)
    a.op(C_JMP | J_JEQ | SRC_K, nft.TraceType.RETURN, jt="rule", jf=0)
    a.op(C_JMP | J_JEQ | SRC_K, nft.TraceType.RULE, jt=0, jf="drop")
    a.label("rule")
    a.op(C_LD | M_MEM, CODE)
    a.op(C_JMP | J_JSET | SRC_K, 0x80000000, jt="continues", jf="verdict")   # NFT_* verdicts are negative
    a.label("continues")    # continue, break, jump, goto, return, a chain's end: keep the run's headers (a drop in
                            # this run, by a later rule or the policy, comes without them)
    a.op(C_LD | M_MEM, HEADERS)
    a.op(C_JMP | J_JEQ | SRC_K, 1, jt="keep", jf="drop")
    a.label("verdict")                                # NF_DROP (with an errno in its upper bits, or not)
    a.op(C_LD | M_MEM, CODE)
    a.op(C_ALU | AND | SRC_K, nft.NF_VERDICT_MASK)
    a.op(C_JMP | J_JEQ | SRC_K, nft.NF_DROP, jt="keep", jf="drop")
    a.label("keep")
    a.op(C_RET | SRC_K, KEEP)
    a.label("drop")
    a.op(C_RET | SRC_K, DROP)
    return a.resolve()


def attach(sock) -> None:
    """The filter on a socket (OSError when the kernel refuses it)."""
    insns = program()
    buf = ctypes.create_string_buffer(insns, len(insns))
    fprog = struct.pack("=H6xQ", len(insns) // 8, ctypes.addressof(buf))
    sock.setsockopt(1, SO_ATTACH_FILTER, fprog)   # SOL_SOCKET
