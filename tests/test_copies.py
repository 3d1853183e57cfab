"""--track into copies: where the kernel makes a new skb of a tracked packet (an nftables dup: __pskb_copy_fclone)
or gives it a new head (a tunnel's skb_cow_head on a shared header: pskb_expand_head), fentry and fexit at the copy
functions hand the packet's id over, so the copy's records and the original's share it. Compared with the kernel's
own view: the skbs' addresses in the records, tcpdump on the tunnel. Where the kernel refuses fentry/fexit (this
host) the summary says copies are not followed."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time

from conftest import kernel_refusal, need_tool

from netns import flow_of, read_packets, sh, start_fcap, start_tcpdump


def _udp(dst: str, port: int, n: int, size: int = 20) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(n):
            s.sendto(b"f" * size, (dst, port))


def _by_id(recs) -> dict[int, list]:
    """The records per packet id, each list in time order."""
    out: dict[int, list] = {}
    for p in sorted(recs, key=lambda p: p.ts_ns):
        out.setdefault(p.packet_id, []).append(p)
    return out


def test_track_follows_a_packet_into_its_copies(tmp_path, veth_ns):
    """An nftables `dup` in the output hook copies each datagram to the namespace (nf_dup_ipv4: a new skb,
    __pskb_copy_fclone). With --track from fentry/__ip_local_out (before the hook: the datagram is tracked when it is
    copied) to dev:queue and dev:receive, the copy keeps its datagram's packet id (fentry and fexit at the copy
    functions hand it over), while the kernel's own view has two skbs with the datagram's bytes, sent and received
    twice; the first datagram goes to a neighbour not yet resolved (ARP). Where the kernel refuses fentry/fexit
    the summary says copies are not followed."""
    need_tool("nft", "adds the dup rule")
    v = veth_ns
    port = 7600 + os.getpid() % 500
    table = f"fcap_dup_{os.getpid()}"
    subprocess.run(["nft", "-f", "-"], check=True, text=True, input=(   # (nft wants dup's rule on a line of its own)
        f"table ip {table} {{\n chain out {{\n  type filter hook output priority 0;\n"
        f"  ip daddr {v.peer} udp dport {port} dup to {v.peer}\n }}\n}}\n"))
    path = tmp_path / "dup.pcapng"
    follows = all(kernel_refusal(kind, func) is None for kind, func in (("fexit", "__pskb_copy_fclone"),
                                                                        ("fentry", "__ip_local_out")))
    first = ["-i", "fentry/__ip_local_out"] if follows else []
    try:
        f = start_fcap(first + ["-i", "dev:queue", "-i", "dev:receive", "--track", "-w", str(path),
                                f"udp port {port}"])
        try:
            _udp(v.peer, port, 3)
            time.sleep(0.5)
        finally:
            f.stop()
    finally:
        subprocess.run(["nft", "delete", "table", "ip", table], check=False)
    assert f.p.returncode == 0, f.stderr
    if not follows:
        assert "copies not followed" in f.stderr, f.stderr
        return
    recs = [p for p in read_packets(path) if flow_of(p) is not None and flow_of(p).dport == port]
    by_id: dict[int, list] = {}
    for p in sorted(recs, key=lambda p: p.ts_ns):
        by_id.setdefault(p.packet_id, []).append(p)
    # each datagram: one id; sent twice and received twice (the original and its copy: two skbs, the same bytes)
    assert len(by_id) == 3 and len(recs) == 18, {i: [p.iface_name for p in ps] for i, ps in by_id.items()}
    for ps in by_id.values():
        assert sorted(p.iface_name for p in ps) == ["dev:queue"] * 2 + ["dev:receive"] * 2 + \
            ["fentry/__ip_local_out"] * 2, [p.iface_name for p in ps]
        sent = [p for p in ps if p.iface_name == "dev:queue"]
        assert all(p.raw.endswith(b"f" * 20) for p in ps) and len({_skb(p) for p in sent}) == 2, [
            _skb(p) for p in sent]   # (the datagram's bytes in both; the headers differ from point to point)
    m = re.search(r"^(\d+) cop(?:y|ies) of tracked packets followed", f.stderr, re.M)
    assert m and int(m[1]) >= 3, f.stderr


def _skb(p) -> str:
    """The skb address fcap's comment gives a record."""
    return re.search(r"skb=(0x[0-9a-f]+)", p.comment or "")[1]


def _skb(p) -> str:
    """The skb address fcap's comment gives a record."""
    return re.search(r"skb=(0x[0-9a-f]+)", p.comment or "")[1]


def test_track_follows_a_packet_through_a_tunnels_new_head(tmp_path, veth_ns):
    """A VXLAN tunnel over the veth pair, and a packet socket on the tunnel that holds a clone of each datagram (as
    a sniffer that has not read yet does): the tunnel's transmit finds the header shared and gives the skb a new
    head (vxlan_build_skb's skb_cow_head: pskb_expand_head) before it adds the outer headers. With --track
    'udp port P' at dev:queue, dev:receive and skb:drop, each datagram to the namespace's closed port keeps one id
    from the tunnel's queue (inner) through the veth pair (outer, UDP to 4789: past the filter only by tracking)
    to the drop after decapsulation; the summary counts the new heads. tcpdump on the tunnel sees the same
    datagrams."""
    v = veth_ns
    port = 8100 + os.getpid() % 500
    n = os.getpid() % 200 * 4 + 4   # the tunnel's /30 in 198.19.0.0/16
    vx = f"fcx{os.getpid() % 100000}"
    near, far = f"198.19.{n // 256}.{n % 256 + 1}", f"198.19.{n // 256}.{n % 256 + 2}"
    far_mac = "02:fc:00:00:00:02"
    sh("ip", "link", "add", vx, "address", "02:fc:00:00:00:01", "type", "vxlan", "id", "42", "local", v.local,
       "remote", v.peer, "dstport", "4789", "dev", v.a)
    try:
        sh(*v.exec("ip", "link", "add", vx, "address", far_mac, "type", "vxlan", "id", "42", "local", v.peer,
                   "remote", v.local, "dstport", "4789", "dev", v.b))
        sh("ip", "addr", "add", f"{near}/30", "dev", vx)
        sh(*v.exec("ip", "addr", "add", f"{far}/30", "dev", vx))
        sh("ip", "link", "set", vx, "up")
        sh(*v.exec("ip", "link", "set", vx, "up"))
        sh("ip", "neigh", "replace", far, "lladdr", far_mac, "dev", vx)   # (no ARP inside the tunnel)
        follows = kernel_refusal("fexit", "pskb_expand_head") is None
        path, seen = tmp_path / "vxlan.pcapng", tmp_path / "tcpdump.pcap"
        held = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))   # ETH_P_ALL, never read
        held.bind((vx, 0))
        try:
            td = start_tcpdump(vx, seen, f"udp port {port}")
            f = start_fcap(["-i", "dev:queue", "-i", "dev:receive", "-i", "skb:drop", "--track", "-w", str(path),
                            f"udp port {port}"])
            try:
                _udp(far, port, 3)
                time.sleep(0.5)
            finally:
                f.stop()
                td.stop()
        finally:
            held.close()
    finally:
        sh("ip", "link", "del", vx, check=False)
    assert f.p.returncode == 0, f.stderr
    assert len(read_packets(seen)) == 3, td.stderr   # (the kernel's own view: three datagrams into the tunnel)
    by_id = _by_id(read_packets(path))
    names = sorted([p.iface_name for p in ps] for ps in by_id.values())
    if not follows:   # the new head is a new packet to fcap, as the summary warns: the outer one not followed
        assert "copies not followed" in f.stderr, f.stderr
        assert names == [["dev:queue"]] * 3 + [["dev:receive", "skb:drop"]] * 3, names
        return
    journey = ["dev:queue", "dev:queue", "dev:receive", "dev:receive", "skb:drop"]   # inner, outer, outer, inner
    assert len(by_id) == 3 and all([p.iface_name for p in ps] == journey for ps in by_id.values()), {
        i: [(p.iface_name, len(p.l3)) for p in ps] for i, ps in by_id.items()}
    for ps in by_id.values():
        assert [flow_of(p).dport == port for p in ps] == [True, False, False, True, True], ps
        assert ps[1].l3[9] == 17 and ps[1].l3.endswith(b"f" * 20)   # the outer packet: UDP, the datagram inside
    m = re.search(r"^\d+ cop(?:y|ies) of tracked packets followed under their ids, (\d+) given a new head", f.stderr,
                  re.M)
    assert m and int(m[1]) >= 3, f.stderr
