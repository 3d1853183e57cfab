"""Printing's CPU per packet: fcap -r FILE (-nn, -v, --json, --decode; the same packets in pcapng), fcap.read(),
fcap.batches() beside tcpdump -r -nn (and -nn -v, and of the pcapng file).

    python -m bench.printing [--packets 200000] [--rounds 3] [--keep DIR] [--tree NAME=CHECKOUT ...]

A mixed Ethernet pcap (IPv4 and IPv6 TCP with and without options, UDP, ICMP echo and unreachable, ICMPv6 echo and
neighbour discovery, ARP; a few hundred distinct packets over 40 conversations, repeated to --packets) is written once
to a temporary directory. Each round runs every case once, in the same order (interleaved, so that a busy machine
weighs on all alike): the tools as users run them with stdout to /dev/null, and a child iterating fcap.read(FILE)
that touches each Packet's common attributes. The CPU of a case is its child's user + sys time (os.wait4); the
table gives the median over the rounds in µs per packet and the ratio to tcpdump's with the same flags (-nn, or
-nn -v; --decode, scapy's, to -nn's). The file is printed whole (no -c; --decode its first --v-packets): start-up
(Python's imports, ~0.1 s) is in fcap's numbers, spread over the packets; the last columns leave it out: each case
also runs on the file's first tenth (at least SMALL packets, a file still read a batch at a time), and the
difference of the two CPU times over the difference of their packets is a packet's cost past start-up. --tree adds
the -r cases of fcap as another checkout has it (`git worktree add /tmp/old REV`), in the same rounds."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FCAP = [sys.executable, "-m", "fcap"]
API = ("import fcap\n"
       "n = 0\n"
       "for p in fcap.read(%r):\n"
       "    n += p.ts_ns + p.orig_len + p.linktype + len(p.data) + (p.point is None) + (p.comment is None)\n")
BATCHES = ("import fcap\n"   # the arrays, and a question of them: the SYNs' destination ports counted
           "n = 0\n"
           "for b in fcap.batches(%r):\n"
           "    f = b.fields\n"
           "    n += int(f['ts_ns'].max()) + len(set(f['dport'][(f['proto'] == 6) & (f['tcp_flags'] & 18 == 2)]))\n")


def _packets() -> list[bytes]:
    """A few hundred distinct Ethernet frames: the kinds of a busy host's traffic."""
    import dpkt
    frames = []
    mac_a, mac_b = b"\x02\x00\x00\x00\x00\x01", b"\x02\x00\x00\x00\x00\x02"

    def eth(payload, etype, rev=False):
        return bytes(dpkt.ethernet.Ethernet(src=mac_b if rev else mac_a, dst=mac_a if rev else mac_b, type=etype,
                                            data=payload))

    def ip4(i, proto, payload, rev=False):
        a, b = bytes((10, 0, i // 256, i % 256)), bytes((192, 168, 1, i % 200 + 1))
        ip = dpkt.ip.IP(src=b if rev else a, dst=a if rev else b, p=proto, ttl=64, id=i, data=payload)
        ip.len = 20 + len(bytes(payload))
        return eth(bytes(ip), 0x0800, rev)

    def ip6(i, nh, payload, rev=False):
        a, b = bytes.fromhex("20010db8000000000000000000000000")[:14] + i.to_bytes(2, "big"), \
            bytes.fromhex("fe800000000000000000000000000001")
        body = bytes(payload)
        ip = dpkt.ip6.IP6(src=b if rev else a, dst=a if rev else b, nxt=nh, hlim=64, plen=len(body), data=b"")
        ip.extension_hdrs = {}
        return eth(bytes(ip)[:40] + body, 0x86DD, rev)

    for i in range(40):   # conversations: a handshake, data both ways with timestamps, a FIN
        sport, dport = 40000 + i, (443, 5201, 22, 9999)[i % 4]
        mk = ip4 if i % 3 else ip6
        proto = 6
        seq, ack = 1000 * i + 1, 5000 * i + 1
        ts_opt = b"\x01\x01\x08\x0a" + (123456 + i).to_bytes(4, "big") + (654321).to_bytes(4, "big")
        syn = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq, flags=0x02, win=64240,
                           opts=b"\x02\x04\x05\xb4\x04\x02\x08\x0a" + ts_opt[4:] + b"\x01\x03\x03\x07")
        synack = dpkt.tcp.TCP(sport=dport, dport=sport, seq=ack, ack=seq + 1, flags=0x12, win=65160,
                              opts=b"\x02\x04\x05\xb4\x04\x02\x08\x0a" + ts_opt[4:] + b"\x01\x03\x03\x07")
        for t in (syn, synack):
            t.off = (20 + len(t.opts)) // 4
        frames += [mk(i, proto, syn), mk(i, proto, synack, True)]
        for k in range(4):
            payload = bytes((j * 7 + k) % 256 for j in range(40 + 100 * k))
            d = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq + 1 + k * 1000, ack=ack + 1, flags=0x18,
                             win=502, opts=ts_opt, data=payload)
            a = dpkt.tcp.TCP(sport=dport, dport=sport, seq=ack + 1, ack=seq + 1 + k * 1000 + len(payload),
                             flags=0x10, win=509, opts=ts_opt if k % 2 else b"")
            for t in (d, a):
                t.off = (20 + len(t.opts)) // 4
            frames += [mk(i, proto, d), mk(i, proto, a, True)]
        fin = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq + 4001, ack=ack + 1, flags=0x11, win=502)
        frames.append(mk(i, proto, fin))
        udp = dpkt.udp.UDP(sport=50000 + i, dport=47000 + i, data=b"\x12\x34" + bytes(30 + i))
        udp.ulen = 8 + len(udp.data)
        frames.append(mk(i, 17, udp))
        frames.append(mk(i, 17, udp, True))
        if mk is ip4:
            echo = dpkt.icmp.ICMP(type=8, code=0, data=dpkt.icmp.ICMP.Echo(id=i, seq=k, data=bytes(56)))
            frames += [ip4(i, 1, echo), ip4(i, 1, dpkt.icmp.ICMP(type=0, code=0, data=echo.data), True)]
            quoted = bytes(dpkt.ip.IP(src=b"\x0a\x00\x00\x01", dst=b"\xc0\xa8\x01\x01", p=17,
                                      data=bytes(dpkt.udp.UDP(sport=1234, dport=33434 + i, ulen=8))))
            frames.append(ip4(i, 1, dpkt.icmp.ICMP(type=3, code=3, data=b"\x00" * 4 + quoted), True))
        else:
            echo = dpkt.icmp6.ICMP6(type=128, code=0, data=dpkt.icmp6.ICMP6.Echo(id=i, seq=1, data=bytes(56)))
            frames += [ip6(i, 58, echo), ip6(i, 58, dpkt.icmp6.ICMP6(type=129, code=0, data=echo.data), True)]
            ns = dpkt.icmp6.ICMP6(type=135, code=0, data=b"\x00" * 4 + bytes.fromhex("fe80" + "00" * 13 + "01")
                                  + b"\x01\x01" + mac_a)
            frames.append(ip6(i, 58, ns))
        arp = dpkt.arp.ARP(op=1 + i % 2, sha=mac_a, spa=bytes((10, 0, 0, i)), tha=b"\x00" * 6 if i % 2 == 0
                           else mac_b, tpa=bytes((10, 0, 0, 254)))
        frames.append(eth(bytes(arp) + bytes(18 * (i % 2)), 0x0806, bool(i % 2)))   # (a reply padded, as received)
    return frames


def write_file(path: str, n: int) -> int:
    """The mixed pcap of n packets (microsecond stamps, 1 ms apart); how many distinct frames it repeats."""
    import dpkt
    frames = _packets()
    with open(path, "wb") as f:
        w = dpkt.pcap.Writer(f, linktype=dpkt.pcap.DLT_EN10MB, snaplen=262144)
        t = 1_780_000_000.0
        for i in range(n):
            w.writepkt(frames[i % len(frames)], ts=t + i * 0.001)
    return len(frames)


def write_pcapng(path: str, n: int) -> None:
    """The same packets as write_file's in a pcapng file as fcap writes one (a comment naming the point on each)."""
    from fcap.files.pcapfile import PcapngWriter
    frames = _packets()
    with open(path, "wb") as f:
        w = PcapngWriter(f)
        w.add_interface("tp_btf/net_dev_queue", 1)
        t = 1_780_000_000 * 10**9
        for i in range(n):
            frame = frames[i % len(frames)]
            w.write(t + i * 10**6, frame, len(frame), comment="tp_btf/net_dev_queue")


def cpu_of(argv: list[str], cwd: str = ROOT) -> float:
    """The CPU seconds (user + sys) of a command run in `cwd` (python -m fcap: that checkout's) with stdout to
    /dev/null."""
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(argv, stdout=null, stderr=subprocess.PIPE, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {err.strip()[-500:]}")
    return usage.ru_utime + usage.ru_stime


def cases(path: str, v_packets: int, trees: dict[str, str]) -> list[tuple[str, list[str], str]]:
    """(name, argv, directory it runs in): tcpdump's cases first (each fcap case is compared with the tcpdump case
    of its flags and file: F the pcap file, G the same packets in a pcapng file); each tree's -r cases last."""
    tcpdump = shutil.which("tcpdump")
    ng = path + "ng"
    out = [("tcpdump -r F -nn", [tcpdump, "-r", path, "-nn"], ROOT),
           ("tcpdump -r F -nn -v", [tcpdump, "-r", path, "-nn", "-v"], ROOT),
           ("tcpdump -r G -nn", [tcpdump, "-r", ng, "-nn"], ROOT)] if tcpdump else []
    reads = [("-r F -nn", ["-r", path, "-nn"]), ("-r F -nn -v", ["-r", path, "-nn", "-v"]),
             ("-r G -nn", ["-r", ng, "-nn"]), ("-r F --json", ["-r", path, "--json"])]
    return out + [(f"fcap {name}", FCAP + args, ROOT) for name, args in reads] + [
        ("fcap.read(F)", [sys.executable, "-c", API % path], ROOT),
        ("fcap.batches(F)", [sys.executable, "-c", BATCHES % path], ROOT),
        ("fcap -r F --decode", FCAP + ["-r", path, "--decode", "-c", str(v_packets)], ROOT)] + [
        (f"fcap@{tree} {name}", FCAP + args, checkout) for tree, checkout in trees.items() for name, args in reads]


def _baseline(name: str) -> str:
    """The tcpdump case a case is compared with: -v with tcpdump -nn -v, the pcapng file's with tcpdump's of it,
    every other with tcpdump -nn."""
    return "tcpdump -r F -nn -v" if name.endswith("-v") else "tcpdump -r G -nn" if " G " in name else \
        "tcpdump -r F -nn"


SMALL = 20_000   # packets of the small file at least: 2.7 MB, past the size from which fcap -r reads in batches


def _table(times: dict, names: list[str], a, distinct: int, small: int) -> None:
    """The medians: CPU a packet of the whole run and past start-up (the small file's run taken off), each with its
    ratio to tcpdump's case of its flags."""
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{a.packets} packets ({distinct} distinct, Ethernet), median CPU of {a.rounds} rounds; past start-up: less "
          f"a run of the first {small}\n")
    print("| case | µs/packet | × tcpdump (-nn, or -nn -v for -v) | past start-up, µs/packet | × tcpdump |\n"
          "|---|---:|---:|---:|---:|")
    for name in names:
        n = min(a.v_packets, a.packets) if name.endswith("--decode") else a.packets
        base = med.get(_baseline(name))
        ratio = f"{med[name] / n / (base / a.packets):.2f}" if base else "-"
        past = f"{name} (small)"
        if past in med and f"{_baseline(name)} (small)" in med:
            each = (med[name] - med[past]) / (a.packets - small)
            their = (base - med[f"{_baseline(name)} (small)"]) / (a.packets - small)
            more = f"{each * 1e6:.2f} | {each / their:.2f}"
        else:
            more = "- | -"
        print(f"| `{name}` | {med[name] / n * 1e6:.2f} | {ratio} | {more} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.printing", description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--v-packets", type=int, default=20_000,
                    help="--decode prints only the first N (-c N; scapy's decode: ~0.7 ms a packet)")
    ap.add_argument("--keep", metavar="DIR", help="write the pcap into DIR and leave it there")
    ap.add_argument("--only", action="append", help="only the cases whose name contains this (repeatable)")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=CHECKOUT",
                    help="the -r cases of fcap as the checkout CHECKOUT has it too, named fcap@NAME (repeatable)")
    a = ap.parse_args(argv)
    trees = dict(t.split("=", 1) for t in a.tree if "=" in t)
    for bad in [t for t in a.tree if "=" not in t] + [c for c in trees.values() if not os.path.isdir(f"{c}/fcap")]:
        ap.error(f"--tree wants NAME=CHECKOUT, a directory holding fcap/: {bad}")
    for checkout in trees.values():   # (their bytecode made before the rounds, not in the first)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "fcap", "bpf"], cwd=checkout, check=True,
                       stdout=subprocess.DEVNULL)
    made = None if a.keep else tempfile.mkdtemp(prefix="fcap-printing-")   # (removed after: nothing else is)
    where = a.keep or made
    path = os.path.join(where, "mixed.pcap")
    try:
        distinct = write_file(path, a.packets)
        write_pcapng(path + "ng", a.packets)
        small = max(a.packets // 10, SMALL) if a.packets > 2 * SMALL else 0
        if small:
            write_file(os.path.join(where, "small.pcap"), small)
            write_pcapng(os.path.join(where, "small.pcapng"), small)
        wanted = [c for c in cases(path, min(a.v_packets, a.packets), trees)
                  if not a.only or c[0].startswith("tcpdump") or any(o in c[0] for o in a.only)]
        smaller = dict((name, (cmd, cwd)) for name, cmd, cwd in cases(os.path.join(where, "small.pcap"), small, trees)
                       ) if small else {}
        todo = [(name, cmd, cwd) for name, cmd, cwd in wanted] + \
            [(f"{name} (small)", *smaller[name]) for name, _, _ in wanted if name in smaller
             and not name.endswith("--decode")]
        times: dict[str, list[float]] = {name: [] for name, _, _ in todo}
        for _ in range(a.rounds):
            for name, cmd, cwd in todo:
                times[name].append(cpu_of(cmd, cwd))
        _table(times, [name for name, _, _ in wanted], a, distinct, small)
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
