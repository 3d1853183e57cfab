"""Test helpers for bpf.cbpf: a reference cBPF interpreter, a kernel harness (BPF_PROG_TEST_RUN), packets, filters."""

from __future__ import annotations

import errno
import os
import random
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from bpf import asm, cbpf
from bpf.asm import FP, R0, R1, R2, R3, R4, R6, R7, R8, R9, W
from bpf.errors import VerifierError
from bpf.maps import ArrayMap
from bpf.prog import load
from bpf.uapi import Helper, ProgType
from cbpf_ref import AD_FROM, run_cbpf  # noqa: F401 - the tests call them through this module
from corpus import CAPTURES, CORPUS, FILTERS_TSV  # noqa: F401 - the tests read them from here too

SEED = 20240607
SNAPLEN = 262144
NETMASK = 0xFFFFFF00

# libpcap DLT numbers as libpcap on Linux spells them (DLT_RAW is 12 here; pcap files say LINKTYPE_RAW = 101)
DLT = {"EN10MB": 1, "RAW": 12, "IPV4": 228, "IPV6": 229, "LINUX_SLL": 113, "LINUX_SLL2": 276, "NULL": 0,
       "LOOP": 108, "IEEE802_11": 105}
# pcap-file linktype → the DLT name whose packets they are
FILE_LINKTYPE = {1: "EN10MB", 101: "RAW", 12: "RAW", 14: "RAW", 228: "IPV4", 229: "IPV6", 113: "LINUX_SLL",
                 276: "LINUX_SLL2", 0: "NULL", 108: "LOOP", 105: "IEEE802_11", 127: "RADIOTAP"}
MAX_PACKET = 2900   # BPF_PROG_TEST_RUN takes at most a page minus headroom and skb_shared_info
BASE = 14           # the harness skb starts with 14 filler bytes (test_run needs an Ethernet header's worth)
# Inside tests/vm/run guests (TCG, ~10x slower): the kernel runs every translated program over every 8th packet, and
# scapy crafts an 8th of the packets (building them alone took 30-48 s of each guest); the host runs and makes all.
GUEST_STRIDE = 8 if os.environ.get("FCAP_VM") else 1


# ---- kernel harness ------------------------------------------------------------------------------

def skb_slow_load(base: int, slot: int):
    """A PacketModel.slow_load for SCHED_CLS: bpf_skb_load_bytes(ctx in R6, off + base, FP+slot, size)."""
    def emit(size: int, off_reg: int, dst: int, reject: str) -> list:
        out = []
        if off_reg != R2:
            out.append(asm.mov(R2, off_reg))
        out += [asm.addi(R2, base), asm.mov(R1, R6), asm.mov(R3, FP), asm.addi(R3, slot), asm.movi(R4, size),
                asm.call(Helper.skb_load_bytes), asm.jmp(asm.JNE, R0, 0, reject),
                asm.ldx({1: asm.B, 2: asm.H, 4: W}[size], dst, FP, slot)]
        return out
    return emit


# __sk_buff offsets (and whether the value is big-endian) of the fields Linux's ancillary loads read
SKB_AD = {0: (16, True), 4: (4, False), 8: (40, False), 12: (8, False), 16: (12, False), 32: (68, False),
          44: (24, False), 48: (20, False), 60: (28, True)}


def skb_ancillary(field: int, dst: int, reject: str) -> list:
    """A PacketModel.ancillary for SCHED_CLS (ctx in R6): fields from __sk_buff, cpu and random from helpers."""
    if field in (36, 56):
        return [asm.call(Helper.get_smp_processor_id if field == 36 else Helper.get_prandom_u32)] + (
            [asm.mov32(dst, R0)] if dst != R0 else [])
    if field not in SKB_AD:
        raise cbpf.CBPFError(f"{cbpf.ANCILLARY[field]}: __sk_buff has no such field")
    off, swap = SKB_AD[field]
    return [asm.ldx(W, dst, R6, off)] + ([asm.be(dst, 16)] if swap else [])


def division_tracked() -> bool:
    """The translator's choice for loops on this kernel, as fcap's capture programs make it."""
    from bpf import probes
    return probes.division_ranges() is None


@dataclass
class Harness:
    """One SCHED_CLS program running several translated cBPF programs on the bytes after the first BASE of the
    skb. Each one's result goes to u32 slot i of a result map; the program returns the last one's result.
    capacity: bytes copied into the buffer; slow: loads past capacity through bpf_skb_load_bytes."""

    progs: list
    capacity: int = 4096
    slow: bool = False
    ancillary: bool = False
    prog: object = None
    pktmap: ArrayMap = None
    resmap: ArrayMap = None
    ebpf_insns: int = 0
    per_filter: list = field(default_factory=list)

    def __post_init__(self):
        cap = self.capacity
        self.pktmap = ArrayMap(cap, 1, name="cbpf_pkt")
        self.resmap = ArrayMap(4 * max(1, len(self.progs)), 1, name="cbpf_res")
        ctx, buf, wirelen, buflen = R6, R7, R8, R9
        lengths = [asm.ldx(W, wirelen, ctx, 0), asm.addi(wirelen, -BASE)]     # __sk_buff.len
        items = [asm.mov(ctx, R1), asm.ld_map_value(buf, self.pktmap.fileno()), *lengths,
                 asm.mov(R4, wirelen),
                 asm.jmp(asm.JLE, R4, cap, "h_fits"), asm.movi(R4, cap), asm.label("h_fits"),
                 asm.jmp(asm.JLT, R4, 1, "h_copied"),
                 asm.mov(R1, ctx), asm.movi(R2, BASE), asm.mov(R3, buf),
                 asm.call(Helper.skb_load_bytes),
                 asm.jmp(asm.JEQ, R0, 0, "h_copied"), asm.movi(R0, 0xDEAD), asm.exit_(),
                 asm.label("h_copied")]
        anc = skb_ancillary if self.ancillary else None
        if self.slow:
            model = cbpf.PacketModel(buf, wirelen, wirelen, cap, skb_slow_load(BASE, -8), anc, division_tracked())
        else:
            model = cbpf.PacketModel(buf, buflen, wirelen, cap, ancillary=anc, division_tracked=division_tracked())
        for i, p in enumerate(self.progs):
            # Each filter starts from lengths read afresh, as in a capture program of its own: what an earlier
            # filter's tests taught the verifier about them must not reach the next one (5.10's verifier walks
            # paths with contradictory bounds, umin > umax, and turns a pointer plus such a value into a scalar).
            items += lengths if i else []
            if not self.slow:
                items += [asm.mov(buflen, wirelen), asm.jmp(asm.JLE, buflen, cap, f"f{i}_buflen"),
                          asm.movi(buflen, cap), asm.label(f"f{i}_buflen")]
            body = cbpf.translate(p, model, result=R0, done=f"f{i}_done", prefix=f"f{i}", stack_off=-80)
            self.per_filter.append(sum(1 for it in body if isinstance(it, asm.Insn)) + sum(
                1 for it in body if isinstance(it, asm.Insn) and it.imm64 is not None))
            items += body
            items += [asm.label(f"f{i}_done"), asm.ld_map_value(R1, self.resmap.fileno(), 4 * i),
                      asm.stx(W, R1, 0, R0)]
        items.append(asm.exit_())
        self.prog = load(ProgType.SCHED_CLS, items, name="cbpf_test")
        self.ebpf_insns = len(self.prog.insns)

    def run(self, pkt: bytes, head: bytes = bytes(BASE), ctx: bytes | None = None) -> tuple[int, list[int]]:
        """(retval, results of every filter) for one packet, after the BASE bytes `head` (the Ethernet header
        the kernel's test run parses: it sets the skb's protocol and pkt_type) with __sk_buff `ctx`."""
        retval, _, _ = self.prog.test_run(head + pkt, ctx)
        raw = self.resmap.lookup(0)
        return retval, list(struct.unpack(f"<{len(self.progs)}I", raw[: 4 * len(self.progs)]))

    def close(self):
        self.prog.close()
        self.pktmap.close()
        self.resmap.close()


def groups(progs: list[tuple], max_insns: int = 3000, max_progs: int = 16):
    """Programs in batches for one harness each (16 at most: 5.10's verifier spent minutes on batches of 64)."""
    group, size = [], 0
    for p in progs:
        if group and (size + len(p) > max_insns or len(group) >= max_progs):
            yield group
            group, size = [], 0
        group.append(p)
        size += len(p)
    if group:
        yield group


def fitting(groups, **kw):
    """(group, Harness) for each group; a group whose batch program is too big for this kernel's verifier
    (E2BIG: older verifiers prune fewer states, 6.1 gives up at a million processed instructions) is split."""
    for group in groups:
        todo = [list(group)]
        while todo:
            g = todo.pop(0)
            try:
                h = Harness(g, **kw)
            except VerifierError as e:
                if e.errno != errno.E2BIG or len(g) == 1:
                    raise
                todo[:0] = [g[: len(g) // 2], g[len(g) // 2:]]
                continue
            yield g, h


def kernel_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root: BPF_PROG_LOAD of SCHED_CLS programs needs CAP_BPF + CAP_NET_ADMIN"
    try:
        p = load(ProgType.SCHED_CLS, [asm.movi(R0, 7), asm.exit_()], name="probe")
        r = p.test_run(bytes(14))[0]
        p.close()
        if r != 7:
            return f"BPF_PROG_TEST_RUN returned {r}, not 7"
    except OSError as e:
        return f"cannot load or test-run a SCHED_CLS program: {e} ({errno.errorcode.get(e.errno, e.errno)})"
    return None


# ---- filters -------------------------------------------------------------------------------------

def corpus_filters() -> list[tuple[str, str]]:
    """(linktype, expression) rows of libpcap-filters.tsv; continuation rows (empty linktype) joined."""
    rows: list[list[str]] = []
    for line in FILTERS_TSV.read_text().splitlines():
        lt, _, expr = line.partition("\t")
        if not lt and rows:
            rows[-1][1] += " " + expr.strip()
        elif lt:
            rows.append([lt, expr.strip()])
    return [(lt, e) for lt, e in rows]


OWN_EN10MB = """
tcp port 80
tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x47455420
tcp[tcpflags] & (tcp-syn|tcp-fin) != 0
tcp[tcpflags] & tcp-syn != 0 and tcp[tcpflags] & tcp-ack == 0
tcp[13] = 18
tcp[tcpflags] & (tcp-rst) != 0 or tcp[tcpflags] == tcp-push|tcp-ack
host 10.0.0.1
host 10.0.0.1 and not port 22
src host 192.168.1.1 and dst net 10.0.0.0/8
net 192.168.0.0/16 or net 172.16.0.0/12
dst net 224.0.0.0/4
port 53
udp port 53 or udp port 123 or udp port 67
portrange 1000-2000
tcp portrange 5000-5010 or udp dst portrange 33434-33534
src port 443 and tcp
icmp
icmp[icmptype] == icmp-echo or icmp[icmptype] == icmp-echoreply
icmp[icmptype] != icmp-echo and icmp[icmptype] != icmp-echoreply
icmp[0] = 3 and icmp[1] = 3
icmp6
icmp6 and ip6[40] == 128
ip6 and tcp
ip6 host ::1
ip6 net 2001:db8::/32
ip6 src fe80::1 or ip6 dst ff02::1
ip6 proto 58
ip6 protochain 6
ip protochain 17
arp
arp or rarp
arp[6:2] = 1
vlan
vlan and tcp port 80
vlan 100
vlan 100 and vlan 200
mpls
pppoes
ether host 00:11:22:33:44:55
ether src 00:11:22:33:44:55 or ether dst ff:ff:ff:ff:ff:ff
ether broadcast or ether multicast
ether proto 0x88cc
ether[0] & 1 = 1
greater 100
less 60
len > 1000
len - 14 > 500
len * 2 > 300
ip[2:2] / 4 > 10
ip[2:2] % 7 = 3
ip[2:2] % (ip[9] + 1) = 0
ip[0] & 0xf != 5
ip[6] & 0x20 != 0 or ip[6:2] & 0x1fff != 0
ip[6:2] & 0x1fff = 0
ip[8] < 5
ip[1] & 0xfc = 0xb8
ip[9] = 47
ip and ip[16] >= 224
ip[12:4] = 0x0a000001 or ip[16:4] = 0x0a000001
ip[12:4] & 0xffff0000 = 0xc0a80000
ip[2:2] - ((ip[0] & 0xf) << 2) - ((tcp[12] & 0xf0) >> 2) > 0
tcp[((tcp[12] & 0xf0) >> 2)] = 0x16 and tcp[((tcp[12] & 0xf0) >> 2) + 5] = 0x01
udp[8:2] = 0x1234 or udp[4:2] > 500
tcp[20:2] ^ 0xffff = 0xabcd
(ip[0] << 24 | ip[1] << 16) >> 16 = 0x4500
-ip[8] & 0xff = 0xc0
ip[3] | ip[2] != 0
ip[9] * ip[8] > 1000
ip[0] >> ip[9] = 0
ip[0] << (ip[1] & 0x3f) = 0
ether[12:2] - 0x800 = 0
ether[len - 1] = 0
ether[len - 4:4] & 0xff = 0
ether[100] = 0 or ether[300:2] = 0
ether[1000:4] != 0
ether[1500] != 0 or ether[2000:2] != 0
ether[ether[13] + 20] > 0x10
ip multicast
ip broadcast
tcp dst port 22 and (tcp[tcpflags] & tcp-syn) != 0
udp and not port 53 and not port 5353
ip host 10.0.0.1 and ip host 10.0.0.2
host 10.0.0.1 or host 10.0.0.2 or host 10.0.0.3 or host 10.0.0.4
(tcp or udp) and (port 80 or port 443 or port 8080)
ip proto \\tcp and tcp[2:2] > 1023
igmp
ip[9] = 2 or ip6[6] = 58
ip[2:2] > 576 and ip[6] & 0x40 = 0
not ip and not ip6 and not arp
stp
llc
ip6[6] = 44
ip6 and ip6[6] = 0
""".strip().splitlines()

OWN_RAW = """
tcp port 80
host 10.0.0.1
net 10.0.0.0/8 and udp
ip[0] & 0xf != 5
ip[2:2] / 4 > 10
ip[2:2] % 7 = 3
ip6 and icmp6
tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x47455420
portrange 1000-2000
len - 20 > 100
ip[6:2] & 0x1fff != 0
icmp[icmptype] = icmp-echo
ip6 protochain 6
ip[len - 1] = 0
udp[8] = 0x45
ip[ip[0] & 0xf] > 0
greater 200
less 40
""".strip().splitlines()


def compile_filter(linktype: str, expr: str, optimize: int = 1):
    import pcapy
    return pcapy.compile(DLT[linktype], SNAPLEN, expr, optimize, NETMASK)


# ---- packets -------------------------------------------------------------------------------------

def _read_capture(path: Path):
    import dpkt
    with open(path, "rb") as fh:
        try:
            reader = dpkt.pcap.Reader(fh)
        except ValueError:
            fh.seek(0)
            reader = dpkt.pcapng.Reader(fh)
        lt = reader.datalink() & 0xFFFF
        return lt, [bytes(buf) for _, buf in reader]


def corpus_packets() -> dict[str, list[bytes]]:
    """Packets of the tcpdump test captures by DLT name; unreadable files skipped."""
    out: dict[str, list[bytes]] = {}
    for path in sorted(CAPTURES.iterdir()):
        try:
            lt, pkts = _read_capture(path)
        except Exception:  # noqa: BLE001 - deliberately malformed captures
            continue
        name = FILE_LINKTYPE.get(lt)
        if name:
            out.setdefault(name, []).extend(p[:MAX_PACKET] for p in pkts)
    return out


def _ips(exprs) -> tuple[list[str], list[str], list[int]]:
    text = " ".join(exprs)
    v4 = sorted(set(re.findall(r"\b(?:\d{1,3}\.){3}\d{1,3}\b", text)))
    v4 = [a for a in v4 if all(int(o) < 256 for o in a.split("."))]
    v6 = sorted(set(re.findall(r"\b[0-9a-fA-F]{0,4}(?::[0-9a-fA-F]{0,4}){2,7}\b", text)))
    ports = sorted({int(p) for p in re.findall(r"\b(?:port|portrange)\s+(\d{1,5})", text) if int(p) < 65536})
    return v4, v6, ports


def crafted_ip(rng: random.Random, exprs) -> list:
    """scapy IPv4/IPv6 packets (no link layer) using the hosts and ports named in the expressions."""
    from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption
    from scapy.layers.inet6 import (ICMPv6EchoRequest, ICMPv6ND_NS, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment,
                                    IPv6ExtHdrHopByHop, IPv6ExtHdrRouting)
    from scapy.packet import Raw
    v4, v6, ports = _ips(exprs)
    v4 = [a for a in v4 if not a.startswith("0.")] + ["10.0.0.1", "10.0.0.2", "192.168.1.1", "224.0.0.1",
                                                       "255.255.255.255", "127.0.0.1", "172.16.5.4"]
    v6 = [a for a in v6 if _valid6(a)] + ["::1", "fe80::1", "ff02::1", "2001:db8::1"]
    ports = ports + [80, 443, 22, 53, 123, 67, 1234, 5005, 33434, 8080, 0, 65535]
    payloads = [b"", b"GET / HTTP/1.1\r\n\r\n", bytes([0x16, 3, 1, 0, 5, 1]) + bytes(40), bytes(range(256)),
                b"\x12\x34" + bytes(30)]
    out = []
    flags = ["S", "SA", "A", "F", "FA", "R", "PA", "", "FSRPAUEC"]
    for _ in range(500 // GUEST_STRIDE):
        src, dst = rng.choice(v4), rng.choice(v4)
        sp, dp = rng.choice(ports), rng.choice(ports)
        pay = Raw(rng.choice(payloads))
        kind = rng.randrange(12)
        ip = IP(src=src, dst=dst, ttl=rng.choice([1, 4, 64, 255]), tos=rng.choice([0, 0xb8]),
                id=rng.randrange(65536))
        if rng.random() < 0.15:
            ip.options = [IPOption(b"\x94\x04\x00\x00")]  # router alert: IHL 6
        if rng.random() < 0.1:
            ip.flags, ip.frag = rng.choice([(1, 0), (0, 185), (1, 10), (2, 0)])
        if kind < 3:
            pkt = ip / TCP(sport=sp, dport=dp, flags=rng.choice(flags), dataofs=rng.choice([None, 8])) / pay
        elif kind < 5:
            pkt = ip / UDP(sport=sp, dport=dp) / pay
        elif kind < 7:
            pkt = ip / ICMP(type=rng.choice([0, 3, 5, 8, 11, 13]), code=rng.choice([0, 1, 3])) / pay
        elif kind == 7:
            pkt = ip.copy()
            pkt.proto = rng.choice([2, 47, 50, 89, 132])
            pkt = pkt / pay
        else:
            s6, d6 = rng.choice(v6), rng.choice(v6)
            ip6 = IPv6(src=s6, dst=d6, hlim=rng.choice([1, 64, 255]))
            ext = rng.choice([None, IPv6ExtHdrHopByHop(), IPv6ExtHdrRouting(), IPv6ExtHdrFragment(m=1),
                              IPv6ExtHdrDestOpt(), IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt()])
            base6 = ip6 / ext if ext is not None else ip6
            l4 = rng.choice([TCP(sport=sp, dport=dp, flags=rng.choice(flags)), UDP(sport=sp, dport=dp),
                             ICMPv6EchoRequest(), ICMPv6ND_NS(tgt=d6)])
            pkt = base6 / l4 / pay
        out.append(bytes(pkt))
    return out


def _valid6(a: str) -> bool:
    import ipaddress
    try:
        ipaddress.IPv6Address(a)
        return True
    except ValueError:
        return False


def crafted_ethernet(rng: random.Random, ip_packets: list[bytes], exprs) -> list[bytes]:
    """Ethernet frames: IP packets behind plain, VLAN and QinQ headers, ARP/RARP, LLC, MPLS, PPPoE, odd types."""
    from scapy.layers.l2 import ARP, LLC, SNAP, Dot1Q, Ether, STP
    macs = ["00:11:22:33:44:55", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "ab:cd:ef:00:00:01", "ab:cd:ef:00:00:02",
            "ab:cd:ef:00:00:03", "33:33:00:00:00:01", "02:00:00:00:00:01"]
    out = []
    for raw in ip_packets:
        et = 0x86DD if raw[0] >> 4 == 6 else 0x800
        src, dst = rng.choice(macs), rng.choice(macs)
        r = rng.random()
        if r < 0.6:
            out.append(bytes(Ether(src=src, dst=dst, type=et)) + raw)
        elif r < 0.75:
            out.append(bytes(Ether(src=src, dst=dst) / Dot1Q(vlan=rng.choice([100, 200, 1]), type=et)) + raw)
        elif r < 0.85:
            out.append(bytes(Ether(src=src, dst=dst) / Dot1Q(vlan=100) / Dot1Q(vlan=200, type=et)) + raw)
        elif r < 0.9:  # MPLS
            out.append(bytes(Ether(src=src, dst=dst, type=0x8847)) + struct.pack(">I", (rng.randrange(1 << 20) << 12)
                                                                              | 0x1FF) + raw)
        else:  # PPPoE session
            proto = 0x21 if et == 0x800 else 0x57
            out.append(bytes(Ether(src=src, dst=dst, type=0x8864)) + struct.pack(">BBHHH", 0x11, 0, 1, len(raw) + 2,
                                                                                 proto) + raw)
    for _ in range(80 // GUEST_STRIDE):
        src, dst = rng.choice(macs), rng.choice(macs)
        op = rng.choice([1, 2, 3, 4])
        out.append(bytes(Ether(src=src, dst=dst, type=rng.choice([0x806, 0x8035])) /
                         ARP(op=op, psrc="10.0.0.1", pdst="10.0.0.2")))
        out.append(bytes(Ether(src=src, dst=dst) / LLC() / SNAP()) + bytes(20))
        out.append(bytes(Ether(src=src, dst="01:80:c2:00:00:00") / LLC(dsap=0x42, ssap=0x42, ctrl=3) / STP()))
        out.append(bytes(Ether(src=src, dst=dst, type=rng.choice([0x88CC, 0x809B, 0x8137, 0x6003, 0x86DD, 0x800,
                                                                0x8100, 0x88A8])))
                   + bytes(rng.randrange(256) for _ in range(rng.randrange(60))))
    return out


def crafted_dot11(rng: random.Random) -> list[bytes]:
    from scapy.layers.dot11 import Dot11, Dot11Beacon, Dot11Elt, Dot11ProbeReq, Dot11QoS
    from scapy.layers.l2 import LLC, SNAP
    macs = ["00:11:22:33:44:55", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "ab:cd:ef:00:00:01", "ab:cd:ef:00:00:02",
            "ab:cd:ef:00:00:03", "ab:cd:ef:00:00:04"]
    out = []
    for _ in range(600 // GUEST_STRIDE):
        t, st = rng.choice([(0, 8), (0, 4), (0, 0), (0, 5), (0, 12), (1, 11), (1, 12), (1, 13), (2, 0), (2, 8),
                            (2, 4), (2, 12), (3, 0)])
        fc = rng.choice([0, 1, 2, 3, 0x40, 0x41, 0x08])
        d = Dot11(type=t, subtype=st, FCfield=fc, addr1=rng.choice(macs), addr2=rng.choice(macs),
                  addr3=rng.choice(macs), addr4=rng.choice(macs))
        if t == 0 and st == 8:
            p = d / Dot11Beacon() / Dot11Elt(ID=0, info=b"ssid")
        elif t == 0 and st == 4:
            p = d / Dot11ProbeReq()
        elif t == 2 and st == 8:
            p = d / Dot11QoS() / LLC() / SNAP(code=0x800) / bytes(20)
        elif t == 2:
            p = d / LLC() / SNAP(code=rng.choice([0x800, 0x86DD, 0x806])) / bytes(20)
        else:
            p = d
        out.append(bytes(p))
    return out


def mutate(rng: random.Random, pkts: list[bytes], n: int) -> list[bytes]:
    """n packets made by truncating and flipping bytes of randomly chosen ones, plus a few random blobs."""
    out = []
    for _ in range(n):
        p = bytearray(rng.choice(pkts))
        r = rng.random()
        if r < 0.4 and p:
            del p[rng.randrange(len(p) + 1):]
        elif r < 0.85 and p:
            for _ in range(rng.randrange(1, 4)):
                p[rng.randrange(len(p))] = rng.randrange(256)
        else:
            p = bytearray(rng.randrange(256) for _ in range(rng.randrange(80)))
        out.append(bytes(p))
    return out


def strip_radiotap(pkts: list[bytes]) -> list[bytes]:
    out = []
    for p in pkts:
        if len(p) >= 4:
            n = int.from_bytes(p[2:4], "little")
            if 4 <= n <= len(p):
                out.append(p[n:])
    return out


def sll_to_sll2(rng: random.Random, pkts: list[bytes]) -> list[bytes]:
    """LINUX_SLL (16-byte header) packets rewritten with a LINUX_SLL2 (20-byte) header."""
    out = []
    for p in pkts:
        if len(p) < 16:
            continue
        pkttype, hatype, halen = struct.unpack(">HHH", p[:6])
        addr, proto = p[6:14], p[14:16]
        out.append(proto + b"\0\0" + struct.pack(">IHBB", rng.choice([1, 2, 7, 10]), hatype, pkttype & 0xFF,
                                                  halen & 0xFF) + addr + p[16:])
    return out


def null_loop(rng: random.Random, ip_packets: list[bytes], order: str) -> list[bytes]:
    out = []
    for raw in ip_packets:
        fam = 2 if raw[0] >> 4 == 4 else rng.choice([24, 28, 30])
        out.append(struct.pack(order + "I", fam) + raw)
    return out


def build_packets(corpus: dict[str, list[bytes]], exprs_by_lt: dict[str, list[str]]) -> dict[str, list[bytes]]:
    """Packets per DLT name: corpus captures, crafted ones and mutations (fixed seed)."""
    rng = random.Random(SEED)
    all_exprs = [e for es in exprs_by_lt.values() for e in es]
    ip_pkts = crafted_ip(rng, all_exprs)
    eth = corpus.get("EN10MB", [])
    ip_from_eth = []
    for p in eth:
        if len(p) > 14 and p[12:14] in (b"\x08\x00", b"\x86\xdd"):
            ip_from_eth.append(p[14:])
    raw = corpus.get("RAW", []) + corpus.get("IPV4", []) + corpus.get("IPV6", []) + ip_pkts + \
        rng.sample(ip_from_eth, min(600, len(ip_from_eth)))
    out: dict[str, list[bytes]] = {}
    en = eth + crafted_ethernet(rng, ip_pkts, all_exprs)
    out["EN10MB"] = en + mutate(rng, en, 1500)
    out["RAW"] = raw + mutate(rng, raw, 600)
    out["IPV4"] = out["RAW"]
    out["IPV6"] = out["RAW"]
    sll = corpus.get("LINUX_SLL", [])
    out["LINUX_SLL"] = sll + mutate(rng, sll, 300)
    sll2 = sll_to_sll2(rng, sll)
    out["LINUX_SLL2"] = sll2 + mutate(rng, sll2, 300)
    null = corpus.get("NULL", []) + null_loop(rng, ip_pkts[:200], "<")
    out["NULL"] = null + mutate(rng, null, 200)
    loop = null_loop(rng, ip_pkts[:200], ">")
    out["LOOP"] = loop + mutate(rng, loop, 200)
    w = strip_radiotap(corpus.get("RADIOTAP", [])) + corpus.get("IEEE802_11", []) + crafted_dot11(rng)
    out["IEEE802_11"] = w + mutate(rng, w, 400)
    return {k: [p[:MAX_PACKET] for p in v] for k, v in out.items()}
