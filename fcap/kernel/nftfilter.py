"""--nft's socket filter: an eBPF program on fcap's nf_tables trace socket that finds each drop verdict in the kernel.

nf_tables sends its trace events from the packet's own path (nft_do_chain, before nf_hook_slow frees a dropped
packet), and a socket filter runs as the event is sent, on the same CPU. The program reads each event's attributes
and leaves in this CPU's value of the slot map (fcap.kernel.layout.NFT_SLOT):
- from an event that carries the packet's headers (the first of each run of a base chain): its trace id and the
  first NFT_HDR bytes of its network header (`cur_*`);
- from a drop verdict (a rule's verdict drop, a base chain's policy drop) of that trace id: those header bytes and
  the key of the rule (`drop_*`), a 64-bit hash of the table's and chain's names, the rule's handle, the family,
  rule or policy, and the trace socket's network namespace (rule_key(), the same in Python).
The drop point's program (fcap.kernel.nftverdict) takes the key into its record when the freed packet's network
header begins with those bytes. The socket queues only the first drop verdict of a key the texts map lacks (the
program marks the key pending there), so that user space names each rule from one event (fcap.host.nftrace) and
every other event costs it nothing. Rules: the session's --nft, its maps, the trace tables and sockets
(fcap.host.nftrace.Tracers) and the names of the keys."""

from __future__ import annotations

import os
import socket

from bpf.asm import (ADD, AND, DW, FP, H, JEQ, JGE, JGT, JLE, JLT, JNE, JSET, LSH, MUL, OR, R0, R1, R2, R3, R4, R6, R7,
                     R8, R9, RSH, SUB, W, XOR, addi, alu64, be, call, exit_, ja, jmp, label, ld_imm64, ld_map_fd, ldx,
                     mov, movi, st, stx)
from bpf.errors import BPFError
from bpf.uapi import Helper, ProgType, UpdateFlags

from fcap.errors import CaptureError
from fcap.host import nftables as nft
from fcap.kernel.layout import NFT_ATTRS, NFT_HDR, NFT_PENDING, NFT_SLOT, NFT_TEXT, NFT_TEXT_KEY

SO_ATTACH_BPF = 50
ATTRS = 24                  # attributes walked (a trace event has at most 16; more are left unread)
FIRST = 20                  # the first attribute: after nlmsghdr (16) and nfgenmsg (4)
FAMILY = 16                 # nfgenmsg's family byte
NAME_MAX = 256              # NFT_NAME_MAXLEN: a table's or chain's name with its NUL
MASK = (1 << 64) - 1
SEED, PRIME = 0xCBF29CE484222325, 0x100000001B3            # FNV-1a's, over 64-bit words
MIX1, MIX2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53        # a 64-bit finalizer's (MurmurHash3's fmix64)
RULE, POLICY = 1, 2         # what decided, in the key

# the program's stack: a loaded word, a map key, what decided (RULE, POLICY), a name's word's offset
BUF, KEY, KIND, WORD = -8, -16, -24, -32


# ---- the key, in Python (user space names a key from the event the socket let through) ---------------------------

def _mix(h: int, v: int) -> int:
    return (h ^ v) * PRIME & MASK


def _name_hash(h: int, raw: bytes) -> int:
    """The hash after a name attribute's payload (its bytes and NUL), 8 bytes at a time, the last word padded with
    zeros, then its length."""
    for i in range(0, len(raw), 8):
        h = _mix(h, int.from_bytes(raw[i:i + 8].ljust(8, b"\0"), "little"))
    return _mix(h, len(raw))


def _final(h: int) -> int:
    h ^= h >> 33
    h = h * MIX1 & MASK
    h ^= h >> 33
    h = h * MIX2 & MASK
    h ^= h >> 33
    return h or 1


def rule_key(family: int, kind: int, chain: bytes, table: bytes, handle: bytes | None, netns: int) -> int:
    """A rule's key as the program makes it: `chain` and `table` the attributes' payloads, `handle` the rule
    handle's 8 bytes as sent (big-endian; policy: ignored), `netns` the trace socket's namespace's inode number."""
    h = _name_hash(_name_hash(SEED, chain), table)
    h = _mix(h, int.from_bytes(handle[:8], "little") if kind == RULE and handle and len(handle) >= 8 else 0)
    return _final(_mix(h, family | kind << 8 | (netns & 0xFFFFFFFF) << 32))


def event_key(payload: bytes, netns: int) -> int | None:
    """The key of an NFT_MSG_TRACE message's payload (after nlmsghdr) that is a drop verdict, else None."""
    t = nft.parse_trace(payload)
    if t is None or not t.decides_drop():
        return None
    a = nft.parse_attrs(payload[FIRST - 16:])
    kind = RULE if t.type == nft.TraceType.RULE else POLICY
    return rule_key(payload[0], kind, a.get(nft.TRACE_CHAIN, b""), a.get(nft.TRACE_TABLE, b""),
                    a.get(nft.TRACE_RULE_HANDLE), netns)


# ---- the program ----------------------------------------------------------------------------------------------
# R6: the event (__sk_buff), R7: the walk's offset, then the hash, R8: this CPU's slot, R9: the event's length,
# then a name's length

def _load(off_reg: int, add: int, nbytes: int, fail: str) -> list:
    """BUF = nbytes of the event at off_reg + add (off_reg: R1-R9 but R2-R4); to `fail` when out of it."""
    return [mov(R2, off_reg), addi(R2, add), mov(R1, R6), mov(R3, FP), addi(R3, BUF), movi(R4, nbytes),
            call(Helper.skb_load_bytes), jmp(JNE, R0, 0, fail)]


def _at(dst: int, kind: int) -> list:
    """dst = where the event's attribute `kind` starts (0: absent), from the slot's attrs (R8)."""
    return [ldx(W, dst, R8, NFT_SLOT.off("attrs") + 8 * kind)]


def _length(dst: int, kind: int) -> list:
    """dst = the attribute's nla_len."""
    return [ldx(W, dst, R8, NFT_SLOT.off("attrs") + 8 * kind + 4)]


def _walk() -> list:
    """Each attribute's offset and length by its type into the slot's attrs (a map value: what the verifier reads
    back from it is unknown to it, so that no path is told apart by which attributes the event had)."""
    out = [st(DW, R8, NFT_SLOT.off("attrs") + j, 0) for j in range(0, 8 * NFT_ATTRS, 8)]
    out += [ldx(W, R9, R6, 0), movi(R7, FIRST)]   # (__sk_buff.len)
    for i in range(ATTRS):
        out += [mov(R1, R7), addi(R1, 4), jmp(JGT, R1, R9, "walked", reg=True), *_load(R7, 0, 4, "walked"),
                ldx(H, R1, FP, BUF), ldx(H, R2, FP, BUF + 2), alu64(AND, R2, nft.NLA_TYPE_MASK),
                jmp(JLT, R1, 4, "walked"), jmp(JGE, R2, NFT_ATTRS, f"next{i}"), mov(R3, R1), alu64(LSH, R3, 32),
                alu64(OR, R3, R7, reg=True), alu64(LSH, R2, 3), alu64(ADD, R2, R8, reg=True),
                stx(DW, R2, NFT_SLOT.off("attrs"), R3),
                label(f"next{i}"), addi(R1, 3), alu64(AND, R1, -4), alu64(ADD, R7, R1, reg=True)]
    return out + [label("walked")]


def _headers() -> list:
    """An event with the packet's headers: their first bytes and its trace id into the slot's cur_*."""
    return [*_at(R7, nft.TRACE_NETWORK_HEADER), jmp(JEQ, R7, 0, "headers_done"),
            *_length(R4, nft.TRACE_NETWORK_HEADER), alu64(SUB, R4, 4), jmp(JLE, R4, NFT_HDR, "hlen"),
            movi(R4, NFT_HDR), label("hlen"), jmp(JLT, R4, 1, "headers_done"),   # (not JEQ 0: 5.10 learns no bound)
            *[st(DW, R8, NFT_SLOT.off("cur_hdr") + j, 0) for j in range(0, NFT_HDR, 8)],
            NFT_SLOT.store(R8, "cur_len", R4), st(W, R8, NFT_SLOT.off("cur_id"), 0),
            mov(R2, R7), addi(R2, 4), mov(R1, R6), mov(R3, R8), addi(R3, NFT_SLOT.off("cur_hdr")),
            call(Helper.skb_load_bytes), jmp(JEQ, R0, 0, "hdr_ok"),
            NFT_SLOT.store_imm(R8, "cur_len", 0), ja("headers_done"), label("hdr_ok"),
            *_at(R7, nft.TRACE_ID), jmp(JEQ, R7, 0, "headers_done"), *_load(R7, 4, 4, "headers_done"),
            ldx(W, R1, FP, BUF), NFT_SLOT.store(R8, "cur_id", R1), label("headers_done")]


def _code(kind: int, inner: int) -> list:
    """R1 = the be32 verdict code at the attribute `kind` + inner (4: a policy's value, 8: past the verdict's
    nested code attribute's header), in host order; no such attribute: "ignore"."""
    return [*_at(R7, kind), jmp(JEQ, R7, 0, "ignore"), *_load(R7, inner, 4, "ignore"), ldx(W, R1, FP, BUF),
            be(R1, 32)]


def _verdict() -> list:
    """To "ignore" unless a drop verdict (KIND: RULE or POLICY) of the trace id whose headers cur_* holds."""
    return [*_at(R7, nft.TRACE_TYPE), jmp(JEQ, R7, 0, "ignore"), *_load(R7, 4, 4, "ignore"),
            ldx(W, R1, FP, BUF), be(R1, 32),
            jmp(JEQ, R1, nft.TraceType.POLICY, "policy"), jmp(JNE, R1, nft.TraceType.RULE, "ignore"),
            *_at(R7, nft.TRACE_VERDICT), jmp(JEQ, R7, 0, "ignore"), *_load(R7, 4, 4, "ignore"),
            ldx(H, R1, FP, BUF + 2), alu64(AND, R1, nft.NLA_TYPE_MASK), jmp(JNE, R1, nft.VERDICT_CODE, "ignore"),
            *_code(nft.TRACE_VERDICT, 8), st(DW, FP, KIND, RULE), ja("code"),
            label("policy"), *_code(nft.TRACE_POLICY, 4), st(DW, FP, KIND, POLICY),
            label("code"), jmp(JSET, R1, 0x80000000, "ignore"), alu64(AND, R1, nft.NF_VERDICT_MASK),
            jmp(JNE, R1, nft.NF_DROP, "ignore"),
            *_at(R7, nft.TRACE_ID), jmp(JEQ, R7, 0, "ignore"), *_load(R7, 4, 4, "ignore"),
            ldx(W, R1, FP, BUF), NFT_SLOT.load(R2, R8, "cur_id"), jmp(JNE, R1, R2, "ignore", reg=True),
            NFT_SLOT.load(R1, R8, "cur_len"), jmp(JEQ, R1, 0, "ignore")]


def _mix_r7(src: int) -> list:
    """R7 = (R7 ^ src) * PRIME (uses R2 unless src is R2)."""
    return [alu64(XOR, R7, src, reg=True), ld_imm64(R2, PRIME), alu64(MUL, R7, R2, reg=True)]


def _hash_name(kind: int) -> list:
    """R7 = the hash after the name attribute `kind` (as _name_hash); absent: "ignore". A loop over the name's words
    (WORD: the offset of this one), not unrolled: the program stays small enough for a socket (optmem_max); the
    bound on WORD, known on each round, tells the rounds apart to the verifier."""
    loop, full, done = f"name{kind}_loop", f"name{kind}_full", f"name{kind}_done"
    return [*_at(R1, kind), jmp(JEQ, R1, 0, "ignore"), *_length(R9, kind), alu64(SUB, R9, 4),
            jmp(JGT, R9, NAME_MAX, "ignore"), st(DW, FP, WORD, 0),
            label(loop), ldx(DW, R1, FP, WORD), jmp(JGE, R1, NAME_MAX, done), jmp(JLE, R9, R1, done, reg=True),
            *_at(R2, kind), alu64(ADD, R2, R1, reg=True), *_load(R2, 4, 8, "ignore"), ldx(DW, R1, FP, BUF),
            ldx(DW, R2, FP, WORD), addi(R2, 8), jmp(JLE, R2, R9, full, reg=True),
            # the last word, cut: its first n - WORD bytes
            mov(R2, R9), ldx(DW, R3, FP, WORD), alu64(SUB, R2, R3, reg=True), alu64(LSH, R2, 3), movi(R3, 1),
            alu64(LSH, R3, R2, reg=True), alu64(SUB, R3, 1), alu64(AND, R1, R3, reg=True), *_mix_r7(R1), ja(done),
            label(full), *_mix_r7(R1), ldx(DW, R1, FP, WORD), addi(R1, 8), stx(DW, FP, WORD, R1), ja(loop),
            label(done), *_mix_r7(R9)]


def _key(netns: int) -> list:
    """R7 = the rule's key (rule_key())."""
    out = [ld_imm64(R7, SEED), *_hash_name(nft.TRACE_CHAIN), *_hash_name(nft.TRACE_TABLE), movi(R1, 0),
           ldx(DW, R3, FP, KIND), jmp(JNE, R3, RULE, "handle"), *_at(R2, nft.TRACE_RULE_HANDLE),
           jmp(JEQ, R2, 0, "handle"), *_load(R2, 4, 8, "ignore"), ldx(DW, R1, FP, BUF), label("handle"),
           *_mix_r7(R1), movi(R1, FAMILY), mov(R2, R1), *_load(R2, 0, 4, "ignore"), ldx(W, R1, FP, BUF),
           alu64(AND, R1, 0xFF), ldx(DW, R3, FP, KIND), alu64(LSH, R3, 8), alu64(OR, R1, R3, reg=True),
           ld_imm64(R3, (netns & 0xFFFFFFFF) << 32), alu64(OR, R1, R3, reg=True), *_mix_r7(R1)]
    for mul in (MIX1, MIX2, None):
        out += [mov(R1, R7), alu64(RSH, R1, 33), alu64(XOR, R7, R1, reg=True)]
        if mul is not None:
            out += [ld_imm64(R1, mul), alu64(MUL, R7, R1, reg=True)]
    return out + [jmp(JNE, R7, 0, "keyed"), movi(R7, 1), label("keyed")]


def program(slots_fd: int, texts_fd: int, netns: int) -> list:
    """The filter (see the module's docstring): `slots_fd` the slot map, `texts_fd` the texts map (a key it holds
    is named: its events stay in the kernel), `netns` the socket's namespace's inode number."""
    drop = NFT_SLOT.off("drop_hdr") - NFT_SLOT.off("cur_hdr")
    return [mov(R6, R1), st(W, FP, KEY, 0), ld_map_fd(R1, slots_fd), mov(R2, FP), addi(R2, KEY),
            call(Helper.map_lookup_elem), jmp(JEQ, R0, 0, "ignore"), mov(R8, R0),
            *_walk(), *_headers(), *_verdict(), *_key(netns),
            *[x for j in range(0, NFT_HDR, 8) for x in (ldx(DW, R1, R8, NFT_SLOT.off("cur_hdr") + j),
                                                        stx(DW, R8, NFT_SLOT.off("cur_hdr") + drop + j, R1))],
            NFT_SLOT.load(R1, R8, "cur_len"), NFT_SLOT.store(R8, "drop_len", R1), NFT_SLOT.store(R8, "drop_rule", R7),
            stx(DW, FP, KEY, R7), ld_map_fd(R1, texts_fd), mov(R2, FP), addi(R2, KEY), call(Helper.map_lookup_elem),
            jmp(JNE, R0, 0, "ignore"),
            # (a key not named yet: pending from now on, and this event to user space; another CPU's first: not)
            st(DW, R8, NFT_SLOT.off("pending") + NFT_TEXT.off("len"), NFT_PENDING), ld_map_fd(R1, texts_fd),
            mov(R2, FP), addi(R2, KEY), mov(R3, R8), addi(R3, NFT_SLOT.off("pending")), movi(R4, UpdateFlags.NOEXIST),
            call(Helper.map_update_elem), jmp(JNE, R0, 0, "ignore"), movi(R0, -1), exit_(),
            label("ignore"), movi(R0, 0), exit_()]


def attach(sock: socket.socket, slots_fd: int, texts_fd: int, netns: int):
    """The filter loaded and on `sock`; returns the program, which the caller closes after the socket."""
    from bpf import prog
    try:
        p = prog.load(ProgType.SOCKET_FILTER, program(slots_fd, texts_fd, netns), name="fcap_nftrace")
    except BPFError as e:
        raise CaptureError(f"--nft: cannot load the trace socket's program ({e})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_BPF, p.fileno())
    except OSError as e:
        p.close()
        raise CaptureError(f"--nft: cannot put a program on the trace socket ({os.strerror(e.errno or 0)})") from None
    return p


class Rules:
    """--nft in one capture: the slot map (`slots`: PERCPU_ARRAY, one NFT_SLOT) and the texts map (`texts`: NFT_TEXT_KEY
    -> NFT_TEXT), the session's; the trace tables and sockets (fcap.host.nftrace.Tracers: fcap's namespace and those
    `where` names) with this module's program on each, and what each rule key names. decision() names a record's
    key, reading the sockets when it is new, and gives its text (`text_of`: a Decision's) to the programs. close()
    deletes the tables; the maps go with the session's."""

    def __init__(self, slots, texts, text_of, where: list | tuple = ()):
        self.slots, self.texts = slots, texts
        self.texts.update(bytes(NFT_TEXT_KEY.size), bytes(NFT_TEXT.size))   # key 0, no rule: the empty text
        self.text_of = text_of
        self.where = where
        self.tracers = None
        self.names: dict = {}   # rule key -> the Decision it names (None: two rules hash alike)
        self.final: int | None = None   # unattributed, read at close()

    def trace(self) -> None:
        """The trace tables and sockets (after the programs are loaded, before they attach: every drop recorded is
        traced)."""
        from fcap.host.nftrace import Tracers
        slots, texts = self.slots.fileno(), self.texts.fileno()
        self.tracers = Tracers(lambda sock, netns: attach(sock, slots, texts, netns), self.where)

    def pump(self) -> None:
        """Name the keys of the drop verdicts queued, and give their texts to the programs."""
        from fcap.kernel.ringrec import give
        for t in self.tracers.tracers:
            for payload in t.payloads():
                key, trace = event_key(payload, t.netns), nft.parse_trace(payload)
                if key is None or trace is None:
                    continue
                d, k = t.decision(trace), key.to_bytes(NFT_TEXT_KEY.size, "little")
                if key in self.names:
                    if self.names[key] not in (None, d):   # (64 bits: never seen; then neither is named)
                        self.names[key] = None
                        give(self.texts, k, NFT_TEXT, "")
                    continue
                self.names[key] = d
                give(self.texts, k, NFT_TEXT, self.text_of(d))

    def decision(self, key: int):
        """What a record's rule key names (fcap.host.nftrace.Decision), None for none."""
        if key not in self.names and self.tracers is not None:
            self.pump()
        return self.names.get(key)

    @property
    def lost(self) -> int:
        return self.tracers.lost if self.tracers is not None else 0

    @property
    def unattributed(self) -> int:
        """The netfilter drops the drop points found no verdict for (counted by their programs; at close(), for
        good)."""
        if self.final is None:
            return self.slots.sum_u64(0, NFT_SLOT.off("unmatched"))
        return self.final

    def note(self) -> str:
        """One line when netfilter drops went unattributed, else ""."""
        return self.tracers.note(self.unattributed) if self.tracers is not None else ""

    def close(self) -> None:
        if self.final is None:
            self.final = self.unattributed
        if self.tracers is not None:
            self.tracers.close()
