"""nf_tables' netlink protocol, as much of it as --nft needs (the UAPI's linux/netfilter/nf_tables.h and nfnetlink.h,
declared here once): a batch that makes a table with base chains and rules of `meta nftrace set 1`, deleting a
table, acknowledgements read back as errno, and the trace events (NFT_MSG_TRACE, group NFNLGRP_NFTRACE) parsed
into Trace tuples. Pure encoding and decoding, and the sockets: NfSocket."""

from __future__ import annotations

import errno as errnos
import os
import socket
import struct
from enum import IntEnum
from typing import NamedTuple

from fcap.errors import CaptureError

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
NFNLGRP_NFTRACE = 9
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11     # NLMSG_MIN_TYPE, +1
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
_NLMSG = struct.Struct("=IHHII")        # nlmsghdr: len, type, flags, seq, pid
_NFGEN = struct.Struct("!BBH")          # nfgenmsg: family, version, res_id (big-endian)
_NLA = struct.Struct("=HH")             # nlattr: len, type


class Msg(IntEnum):
    """enum nf_tables_msg_types (those used)."""
    NEWTABLE = 0
    DELTABLE = 2
    NEWCHAIN = 3
    NEWRULE = 6
    TRACE = 17


class Family(IntEnum):
    """NFPROTO_*: a table's family (the names nft gives them)."""
    inet = 1
    ip = 2
    arp = 3
    netdev = 5
    bridge = 7
    ip6 = 10


class Hook(IntEnum):
    """enum nf_inet_hooks."""
    prerouting = 0
    input = 1
    forward = 2
    output = 3
    postrouting = 4


class TraceType(IntEnum):
    """enum nft_trace_types: what a trace event reports."""
    POLICY = 1     # the base chain's policy decided
    RETURN = 2     # the end of a chain reached (back to the caller)
    RULE = 3       # a rule matched: its verdict


# enum nft_trace_attributes
(TRACE_TABLE, TRACE_CHAIN, TRACE_RULE_HANDLE, TRACE_TYPE, TRACE_VERDICT, TRACE_ID, TRACE_LL_HEADER,
 TRACE_NETWORK_HEADER, TRACE_TRANSPORT_HEADER, TRACE_IIF, TRACE_IIFTYPE, TRACE_OIF, TRACE_OIFTYPE, TRACE_MARK,
 TRACE_NFPROTO, TRACE_POLICY) = range(1, 17)
TABLE_NAME, TABLE_FLAGS = 1, 2                           # enum nft_table_attributes
TABLE_F_OWNER = 0x2                                      # enum nft_table_flags (5.12+): gone with its socket
CHAIN_TABLE, CHAIN_NAME, CHAIN_HOOK, CHAIN_POLICY, CHAIN_TYPE = 1, 3, 4, 5, 7   # enum nft_chain_attributes
HOOK_HOOKNUM, HOOK_PRIORITY = 1, 2                       # enum nft_hook_attributes
RULE_TABLE, RULE_CHAIN, RULE_EXPRESSIONS = 1, 2, 4       # enum nft_rule_attributes
LIST_ELEM = 1                                            # enum nft_list_attributes
EXPR_NAME, EXPR_DATA = 1, 2                              # enum nft_expr_attributes
IMMEDIATE_DREG, IMMEDIATE_DATA = 1, 2                    # enum nft_immediate_attributes
DATA_VALUE, DATA_VERDICT = 1, 2                          # enum nft_data_attributes
VERDICT_CODE, VERDICT_CHAIN = 1, 2                       # enum nft_verdict_attributes
META_KEY, META_SREG = 2, 3                               # enum nft_meta_attributes
META_NFTRACE = 12                                        # enum nft_meta_keys
REG_VERDICT, REG_1 = 0, 1                                # enum nft_registers: the verdict, the first data register
PRIORITY_FIRST = -2**31                                  # NF_IP_PRI_FIRST: before every other chain at the hook

# netfilter's verdicts (NF_*) and nf_tables' own (NFT_*, negative), by the names nft prints
NF_DROP, NF_ACCEPT = 0, 1
VERDICTS = {0: "drop", 1: "accept", 2: "stolen", 3: "queue", 4: "repeat", 5: "stop", -1: "continue", -2: "break",
            -3: "jump", -4: "goto", -5: "return"}
NF_VERDICT_MASK = 0xFF
TRANSACT_S = 5.0                                         # an answer not there by then: ETIMEDOUT


# ---- attributes --------------------------------------------------------------------------------------------------

def _pad(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, value: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    return (_NLA.pack(_NLA.size + len(value), kind) + value).ljust(_pad(_NLA.size + len(value)), b"\0")


def nested(kind: int, *attrs: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(attrs))


def string(kind: int, text: str) -> bytes:
    return attr(kind, text.encode() + b"\0")


def be32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("!i" if value < 0 else "!I", value))


def parse_attrs(data: bytes) -> dict:
    """{type: raw value} of the attributes in data (the last of a type wins; the nested flag dropped)."""
    out, at = {}, 0
    while at + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, at)
        if length < _NLA.size or at + length > len(data):
            break
        out[kind & NLA_TYPE_MASK] = data[at + _NLA.size:at + length]
        at += _pad(length)
    return out


def _u32(raw: bytes | None) -> int | None:
    return struct.unpack("!I", raw[:4])[0] if raw is not None and len(raw) >= 4 else None


def _s32(raw: bytes | None) -> int | None:
    return struct.unpack("!i", raw[:4])[0] if raw is not None and len(raw) >= 4 else None


def _str(raw: bytes | None) -> str | None:
    return raw.split(b"\0", 1)[0].decode(errors="replace") if raw is not None else None


# ---- messages ----------------------------------------------------------------------------------------------------

def message(kind: int, flags: int, seq: int, family: int, payload: bytes, res_id: int = 0) -> bytes:
    """One nfnetlink message: nlmsghdr, nfgenmsg (version 0), the attributes."""
    body = _NFGEN.pack(family, 0, res_id) + payload
    return _NLMSG.pack(_NLMSG.size + len(body), kind, flags, seq, 0) + body


def nft_type(msg: Msg) -> int:
    return NFNL_SUBSYS_NFTABLES << 8 | msg


def batch(seq: int, family: Family, *parts: tuple) -> tuple[bytes, list[int]]:
    """A transaction: BATCH_BEGIN, each (Msg, flags, attributes) with NLM_F_REQUEST|NLM_F_ACK, BATCH_END. The bytes
    and the sequence numbers whose acknowledgements to wait for."""
    out = [message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, b"", NFNL_SUBSYS_NFTABLES)]
    seqs = []
    for i, (msg, flags, payload) in enumerate(parts, 1):
        out.append(message(nft_type(msg), NLM_F_REQUEST | NLM_F_ACK | flags, seq + i, family, payload))
        seqs.append(seq + i)
    out.append(message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq + len(parts) + 1, 0, b"", NFNL_SUBSYS_NFTABLES))
    return b"".join(out), seqs


def new_table(name: str, owner: bool) -> tuple:
    flags = [be32(TABLE_FLAGS, TABLE_F_OWNER)] if owner else []
    return Msg.NEWTABLE, NLM_F_CREATE | NLM_F_EXCL, string(TABLE_NAME, name) + b"".join(flags)


def del_table(name: str) -> tuple:
    return Msg.DELTABLE, 0, string(TABLE_NAME, name)


def new_base_chain(table: str, name: str, hook: Hook, priority: int) -> tuple:
    """A filter base chain at `hook`, policy accept."""
    return Msg.NEWCHAIN, NLM_F_CREATE, (string(CHAIN_TABLE, table) + string(CHAIN_NAME, name)
                                        + nested(CHAIN_HOOK, be32(HOOK_HOOKNUM, hook), be32(HOOK_PRIORITY, priority))
                                        + be32(CHAIN_POLICY, NF_ACCEPT) + string(CHAIN_TYPE, "filter"))


def _expr(name: str, *data: bytes) -> bytes:
    return nested(LIST_ELEM, string(EXPR_NAME, name), nested(EXPR_DATA, *data))


def new_trace_rule(table: str, chain: str) -> tuple:
    """The rule `meta nftrace set 1 accept`: [immediate reg 1 0x00000001] [meta set nftrace with reg 1] [immediate
    reg 0 accept]. (Accept ends this chain only, as its policy would, with one trace event instead of two.)"""
    exprs = nested(RULE_EXPRESSIONS,
                   _expr("immediate", be32(IMMEDIATE_DREG, REG_1),
                         nested(IMMEDIATE_DATA, attr(DATA_VALUE, struct.pack("=I", 1)))),
                   _expr("meta", be32(META_KEY, META_NFTRACE), be32(META_SREG, REG_1)),
                   _expr("immediate", be32(IMMEDIATE_DREG, REG_VERDICT),
                         nested(IMMEDIATE_DATA, nested(DATA_VERDICT, be32(VERDICT_CODE, NF_ACCEPT)))))
    return Msg.NEWRULE, NLM_F_CREATE, string(RULE_TABLE, table) + string(RULE_CHAIN, chain) + exprs


def split(data: bytes):
    """(type, flags, seq, payload) of each netlink message in a datagram."""
    at = 0
    while at + _NLMSG.size <= len(data):
        length, kind, flags, seq, _pid = _NLMSG.unpack_from(data, at)
        if length < _NLMSG.size or at + length > len(data):
            return
        yield kind, flags, seq, data[at + _NLMSG.size:at + length]
        at += _pad(length)


# ---- trace events ------------------------------------------------------------------------------------------------

class Trace(NamedTuple):
    """One nf_tables trace event: the chain it was sent from, what happened there, and the packet's headers (the
    first event of each base chain's run carries them; the rest have None)."""

    family: str              # the table's family: inet, ip, ip6, ...
    table: str
    chain: str
    type: int                # TraceType
    id: int                  # the trace id: the same within one run of a base chain (and what it jumps to)
    rule: int | None         # the rule's handle (RULE events)
    verdict: int | None      # the rule's verdict code (NF_* or NFT_*), or the policy (POLICY events)
    nfproto: int | None      # the packet's protocol family (2: IPv4, 10: IPv6)
    network: bytes | None    # the packet's network header (at most 40 bytes)
    transport: bytes | None  # the first bytes of its transport header
    mark: int                # skb->mark (0: none)

    def decides_drop(self) -> bool:
        """A rule whose verdict is drop, or a policy of drop."""
        return self.verdict is not None and self.verdict >= 0 and self.verdict & NF_VERDICT_MASK == NF_DROP \
            and self.type in (TraceType.RULE, TraceType.POLICY)


def parse_trace(payload: bytes) -> Trace | None:
    """An NFT_MSG_TRACE message's payload (after nlmsghdr) as a Trace; None when it is not one."""
    if len(payload) < _NFGEN.size:
        return None
    family = payload[0]
    a = parse_attrs(payload[_NFGEN.size:])
    kind = _u32(a.get(TRACE_TYPE))
    if kind is None:
        return None
    verdict = None
    if kind == TraceType.POLICY:
        verdict = _u32(a.get(TRACE_POLICY))
    elif TRACE_VERDICT in a:
        verdict = _s32(parse_attrs(a[TRACE_VERDICT]).get(VERDICT_CODE))
    handle = a.get(TRACE_RULE_HANDLE)
    try:
        fam = Family(family).name
    except ValueError:
        fam = str(family)
    return Trace(fam, _str(a.get(TRACE_TABLE)) or "", _str(a.get(TRACE_CHAIN)) or "", kind,
                 _u32(a.get(TRACE_ID)) or 0, struct.unpack("!Q", handle[:8])[0] if handle and len(handle) >= 8
                 else None, verdict, _u32(a.get(TRACE_NFPROTO)), a.get(TRACE_NETWORK_HEADER),
                 a.get(TRACE_TRANSPORT_HEADER), _u32(a.get(TRACE_MARK)) or 0)


# ---- sockets -----------------------------------------------------------------------------------------------------

class NfSocket:
    """A NETLINK_NETFILTER socket of this network namespace: for transactions (send a batch, wait for its
    acknowledgements) or, subscribed to NFNLGRP_NFTRACE, for trace events (non-blocking)."""

    def __init__(self, trace: bool = False, rcvbuf: int = 0):
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
        except OSError as e:
            raise CaptureError(f"--nft: no nfnetlink socket ({os.strerror(e.errno or 0)})") from None
        self.seq = int.from_bytes(os.urandom(2), "little") << 8
        try:
            self.sock.bind((0, 0))
            if rcvbuf:
                try:   # SO_RCVBUFFORCE (root) past net.core.rmem_max, else what rmem_max allows
                    self.sock.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)
                except OSError:
                    self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            if trace:
                self.sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, NFNLGRP_NFTRACE)
                self.sock.setblocking(False)
        except OSError as e:
            self.sock.close()
            raise CaptureError(f"--nft: cannot listen for nftables trace events ({os.strerror(e.errno or 0)})") \
                from None

    def fileno(self) -> int:
        return self.sock.fileno()

    def transact(self, family: Family, *parts: tuple) -> int:
        """Send a batch of (Msg, flags, attributes); 0 when every part was acknowledged, else the first errno (the
        kernel answers each part, or the batch as a whole when it could not)."""
        begin = self.seq
        data, seqs = batch(begin, family, *parts)
        self.seq += len(parts) + 2
        self.sock.settimeout(TRANSACT_S)
        try:
            self.sock.sendall(data)
            waiting, first = set(seqs), 0
            while waiting:
                for kind, _flags, seq, payload in split(self.sock.recv(65536)):
                    if kind != NLMSG_ERROR or not (seq in waiting or seq == begin):
                        continue
                    err = -struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else errnos.EIO
                    first = first or err
                    waiting = set() if seq == begin else waiting - {seq}
            return first
        except socket.timeout:
            return errnos.ETIMEDOUT
        except OSError as e:
            return e.errno or errnos.EIO

    def trace_payloads(self) -> tuple[list, int]:
        """The trace events waiting on the socket (subscribed), each message's payload after nlmsghdr, and how many
        times the kernel could not queue one (ENOBUFS: events lost)."""
        out, lost = [], 0
        while True:
            try:
                buf = self.sock.recv(1 << 16)
            except BlockingIOError:
                return out, lost
            except OSError as e:
                if e.errno == errnos.ENOBUFS:
                    lost += 1
                    continue
                raise
            out += [payload for kind, _flags, _seq, payload in split(buf) if kind == nft_type(Msg.TRACE)]

    def close(self) -> None:
        self.sock.close()
