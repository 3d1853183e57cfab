"""Each packet's context (--context, --cgroup, --container; fcap.kernel.context, ctxnames, containers): the container
parser over the cgroup layouts runtimes make; then live, on real cgroups this test makes in the cgroup2 hierarchy in
those layouts (docker's, containerd's under a Kubernetes pod, podman's) with sender processes moved into them: the
cgroup id, path and container in each record (the socket's cgroup, not the sending task's; the task's where the
skb has no socket), the predicates run in the kernel checked against tcpdump on the same traffic, and `ip netns`
names."""

from __future__ import annotations

import json
import socket
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from fcap.host import containers
from fcap.host.ctxnames import CgroupNames, cgroup2_mount
from netns import (free_port, pcapng_plan, read_packets, run_fcap, send_while_given, sh, start_fcap, start_tcpdump,
                   subprocess_env)

ID = "0123456789abcdef" * 4
ID2 = "fedcba9876543210" * 4
POD = "5f3b1e2a-7c4d-4e8f-9a0b-1c2d3e4f5a6b"

# ---- the parser, over the layouts runtimes make ------------------------------------------------------------------

LAYOUTS = [
    (f"/system.slice/docker-{ID}.scope", containers.Container("docker", ID)),
    (f"/docker/{ID}", containers.Container("docker", ID)),
    (f"/system.slice/containerd.service/cri-containerd-{ID}.scope", containers.Container("containerd", ID)),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
     f"cri-containerd-{ID}.scope", containers.Container("containerd", ID, POD)),
    (f"/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice", containers.Container("", "", POD)),
    (f"/kubepods/besteffort/pod{POD}/{ID}", containers.Container("cri", ID, POD)),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD.replace('-', '_')}.slice/"
     f"crio-{ID}.scope", containers.Container("cri-o", ID, POD)),
    (f"/machine.slice/libpod-{ID}.scope", containers.Container("podman", ID)),
    (f"/machine.slice/libpod-{ID}.scope/container", containers.Container("podman", ID)),
    (f"/libpod_parent/libpod-{ID}", containers.Container("podman", ID)),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope",
     containers.Container("podman", ID)),
]


@pytest.mark.parametrize("path,want", LAYOUTS, ids=[p for p, _w in LAYOUTS])
def test_the_container_a_cgroup_path_names(path, want):
    assert containers.parse(path) == want


@pytest.mark.parametrize("path", ["/", "/system.slice/ssh.service", "/user.slice/user-0.slice/session-3.scope",
                                  f"/machine.slice/libpod-conmon-{ID}.scope", f"/system.slice/docker-{ID[:12]}.scope",
                                  f"/somewhere/{ID}", "/kubepods.slice/kubepods-burstable.slice"])
def test_cgroups_of_no_container(path):
    assert containers.parse(path) is None


def test_container_names_match_ids_prefixes_and_pods():
    c = containers.Container("containerd", ID, POD)
    assert c.text() == f"containerd:{ID}"
    for name in (ID, ID[:12], f"containerd:{ID[:6]}", POD, "pod" + POD, ID.upper()[:8]):
        assert containers.matches(c, name), name
    for name in (ID2[:12], "docker:" + ID[:6], POD[:8]):
        assert not containers.matches(c, name), name


# ---- live: real cgroups in the runtimes' layouts --------------------------------------------------------------

SENDER = r"""
import os, socket, sys
port, before, after = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def move(cg):
    if cg:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
move(before)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
move(after)
for p in sys.argv[4:]:
    s.sendto(p.encode(), ("127.0.0.1", port))
print(os.getpid())
"""


class Tree:
    """cgroups of the test's own under the cgroup2 mount: docker's, a Kubernetes pod's containerd container,
    podman's (relative paths, from the mount, and their ids)."""

    def __init__(self, mount: str):
        self.mount = mount
        self.top = f"fcaptest{os.getpid()}-{uuid.uuid4().hex[:6]}.slice"
        pod = POD.replace("-", "_")
        self.rel = {"docker": f"/{self.top}/system.slice/docker-{ID}.scope",
                    "pod": f"/{self.top}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice",
                    "podman": f"/{self.top}/machine.slice/libpod-{ID2}.scope",
                    "other": f"/{self.top}/system.slice/other.service"}
        self.rel["cri"] = self.rel["pod"] + f"/cri-containerd-{ID2}.scope"
        for rel in self.rel.values():
            os.makedirs(self.full(rel), exist_ok=True)
        self.ids = {k: os.stat(self.full(rel)).st_ino for k, rel in self.rel.items()}

    def full(self, rel: str) -> str:
        return self.mount + rel

    def remove(self) -> None:
        for dirpath, _dirs, _files in sorted(os.walk(self.full("/" + self.top)), key=lambda t: -len(t[0])):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass


@pytest.fixture
def tree(root):
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 hierarchy is mounted")
    try:
        t = Tree(mount)
    except OSError as e:
        pytest.skip(f"cannot make cgroups under {mount}: {e}")
    try:
        yield t
    finally:
        t.remove()


def own_cgroup() -> tuple[str, int]:
    """This process's cgroup2 path and id."""
    with open("/proc/self/cgroup") as f:
        path = next(line.split("::", 1)[1].strip() for line in f if line.startswith("0::"))
    return path, os.stat(cgroup2_mount() + path).st_ino


def send(tree: Tree, port: int, before: str, after: str, *payloads: str) -> int:
    """A sender process whose socket is made in cgroup `before` and whose datagrams leave from `after` (keys of
    tree.rel; "" for this test's own cgroup). Its pid."""
    r = subprocess.run([sys.executable, "-c", SENDER, str(port), tree.full(tree.rel[before]) if before else "",
                        tree.full(tree.rel[after]) if after else "", *payloads], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def packets(path) -> list:
    import fcap
    return list(fcap.read(str(path)))


def test_cgroup_names_walk_the_hierarchy(tree):
    names = CgroupNames()
    assert names.path(1) == "/" and names.path(tree.ids["docker"]) == tree.rel["docker"]
    assert names.target(tree.rel["pod"]) == (tree.ids["pod"], 4, tree.rel["pod"])
    assert names.target(tree.full(tree.rel["pod"]))[0] == tree.ids["pod"]
    assert names.container(ID[:10]) == (tree.ids["docker"], 3, tree.rel["docker"])
    assert names.container(POD) == (tree.ids["pod"], 4, tree.rel["pod"])   # the pod's cgroup, above its containers
    os.mkdir(tree.full(tree.rel["other"]) + "/late")   # made after the first walk: found by walking again
    assert names.path(os.stat(tree.full(tree.rel["other"]) + "/late").st_ino) == tree.rel["other"] + "/late"


def test_context_names_the_sockets_cgroup_and_container(tree, tmp_path):
    """--context: the cgroup of the socket (made in the container's cgroup, sent from elsewhere: still the
    container's), its path and container in the comment, fcap.read() and --json."""
    port = free_port()
    path = tmp_path / "ctx.pcapng"
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "--context", "-c", "4", "-w", str(path),
                     f"udp dst port {port}"])
    try:
        send(tree, port, "docker", "docker", "d1")
        send(tree, port, "docker", "", "d2")          # the socket's cgroup, not the task's
        send(tree, port, "", "", "own")
        send(tree, port, "cri", "other", "k1")
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
    got = {bytes(p.data[-2:]) if p.data[-3:] != b"own" else b"own": p for p in packets(path)}
    assert set(got) == {b"d1", b"d2", b"own", b"k1"}
    for key in (b"d1", b"d2"):
        p = got[key]
        assert (p.cgroup, p.cgroup_path, p.container, p.pod) == (tree.ids["docker"], tree.rel["docker"],
                                                                 f"docker:{ID}", None), p.comment
        assert f" cgroup={p.cgroup} cgroup_path={p.cgroup_path} container=docker:{ID}" in p.comment
    k = got[b"k1"]
    assert (k.cgroup, k.container, k.pod) == (tree.ids["cri"], f"containerd:{ID2}", POD)
    own_path, own_id = own_cgroup()
    assert (got[b"own"].cgroup, got[b"own"].cgroup_path, got[b"own"].container) == (own_id, own_path, None)
    r = run_fcap(["-r", str(path), "--json"])
    objs = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert r.returncode == 0 and sorted(o["cgroup"] for o in objs) == sorted(p.cgroup for p in got.values())
    assert {o.get("container") for o in objs} == {f"docker:{ID}", f"containerd:{ID2}", None}


def test_without_a_socket_the_tasks_cgroup(tree, tmp_path):
    """At a receive point the skb has no socket yet (lo orphans it on transmit): the cgroup is the task's the
    program ran in: the sender's when it ran in the sender (its own softirq), else that task's (ksoftirqd: the
    root)."""
    port = free_port()
    path = tmp_path / "rx.pcapng"
    fc = start_fcap(["-i", "tp_btf/netif_receive_skb", "--context", "-c", "3", "-w", str(path),
                     f"udp dst port {port}"])
    try:
        pid = send(tree, port, "podman", "podman", "p1", "p2", "p3")
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
    got = packets(path)
    assert len(got) == 3
    for p in got:
        if p.pid == pid:
            assert (p.cgroup, p.container) == (tree.ids["podman"], f"podman:{ID2}"), p.comment
        else:
            with open(f"/proc/{p.pid}/cgroup") as f:
                want = next(line.split("::", 1)[1].strip() for line in f if line.startswith("0::"))
            assert p.cgroup_path == want, p.comment


@pytest.mark.parametrize("flag,target,inside", [
    ("--cgroup", "docker", {"docker"}),
    ("--cgroup", "top", {"docker", "cri", "other"}),         # a cgroup and every one under it
    ("--container", ID[:12], {"docker"}),
    ("--container", POD, {"cri"}),                           # a pod: its containers
    ("cgroup ==", "top", {"docker", "cri", "other"}),        # the same as --where tests of the packet's context
    ("container ==", ID[:12], {"docker"}),
], ids=["cgroup", "cgroup-subtree", "container-id", "pod", "where-cgroup", "where-container"])
def test_cgroup_predicates_keep_only_their_packets(tree, tmp_path, tcpdump, flag, target, inside):
    """--cgroup/--container (or --where 'cgroup == PATH', 'container == NAME') run in the kernel: of the same
    datagrams (tcpdump on lo sees every one), fcap writes those whose socket is in the cgroup (or under it) and only
    those."""
    port = free_port()
    fpath, tpath = tmp_path / "f.pcapng", tmp_path / "t.pcap"
    arg = target if "container" in flag else ("/" + tree.top if target == "top" else tree.rel[target])
    flag, arg = ("--where", f"{flag} '{arg}'") if "==" in flag else (flag, arg)
    inside = inside | ({"moved"} if "docker" in inside else set())
    want = 2 * len(inside & {"docker", "cri", "other"}) + len(inside & {"moved"})
    td = start_tcpdump("lo", tpath, f"udp dst port {port}")
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", flag, arg, "-c", str(want), "-w", str(fpath),
                     f"udp dst port {port}"])
    try:
        for key in ("docker", "cri", "other"):
            send(tree, port, key, key, f"{key}-a", f"{key}-b")
        send(tree, port, "", "", "own-a")
        send(tree, port, "docker", "", "moved-a")   # the socket's cgroup decides, not the task's
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
        td.stop()

    def names(path):
        return sorted(bytes(p.l3[28:]).decode() for p in read_packets(path))
    seen = names(tpath)
    assert len(seen) == 8
    assert names(fpath) == sorted(n for n in seen if n.split("-")[0] in inside)


@pytest.mark.parametrize("args,message", [
    (["--cgroup", "/no/such/cgroup/here"], "--cgroup: no cgroup"),
    (["--container", "feedfacefeedface"], "--container: no cgroup of a container"),
    (["--where", "cgroup == /no/such/cgroup/here"], "--cgroup: no cgroup"),
])
def test_a_cgroup_that_is_not_there_is_one_line(root, args, message):
    if cgroup2_mount() is None:
        pytest.skip("no cgroup2 hierarchy is mounted")
    r = run_fcap(["-i", "tp_btf/net_dev_queue", *args, "-c", "1", "-w", "/dev/null"])
    err = r.stderr.decode()
    assert r.returncode != 0 and message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_context_into_a_pcap_file_is_one_line(root, tmp_path):
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "--context", "-c", "1", "-w", str(tmp_path / "x.pcap")])
    err = r.stderr.decode()
    assert r.returncode != 0 and "--context: a pcap file has no room" in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.pcap").exists()


def test_netns_names(root, tmp_path):
    """A packet sent inside an `ip netns add` namespace: its record's netns is that namespace's inode, and
    --context names it (netns_name=)."""
    if shutil.which("ip") is None:
        pytest.skip("no ip command")
    name = f"fcapctx{os.getpid() % 100000}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        inum = os.stat(f"/run/netns/{name}").st_ino
        port = free_port()
        path = tmp_path / "ns.pcapng"
        fc = start_fcap(["-i", "tp_btf/net_dev_queue", "--context", "--netns", str(inum), "-c", "1", "-w",
                         str(path), f"udp dst port {port}"])
        try:
            code = f"import socket; socket.socket(2, 2).sendto(b'ns', ('127.0.0.1', {port}))"
            subprocess.run(["ip", "netns", "exec", name, sys.executable, "-c", code], check=True, timeout=30,
                           env=subprocess_env())
            assert fc.wait() == 0, fc.stderr
        finally:
            fc.kill()
        (p,) = packets(path)
        assert (p.netns, p.netns_name) == (inum, name) and f"netns_name={name}" in p.comment
    finally:
        sh("ip", "netns", "del", name, check=False)


def _names_ride_the_rings() -> None:
    """Skip unless a --context pcapng capture's programs write the file rings here (fcap's own plan for it)."""
    if not pcapng_plan(["tp_btf/net_dev_queue"], context=True).context:
        pytest.skip("the records go through the perf buffer on this kernel (no file rings): the names are user "
                    "space's, as test_context_names_the_sockets_cgroup_and_container checks")


@pytest.mark.parametrize("extra", [[], ["--no-skb-dynptr"]], ids=["rings", "rings and frags by perf"])
def test_the_programs_write_the_names_user_space_gave_them(root, tmp_path, extra):
    """--context into pcapng where the programs write the file rings: the first packet of a (cgroup, netns) goes
    through the perf buffer, user space names it and gives the text to the programs (the map fcap_ctxtext, read with
    bpftool), which write it into the comments of the packets after it themselves: the programs' count of records
    through the perf buffer (fcap_counters' seen, read with bpftool) stays at that first packet, and every comment
    ends with what user space says."""
    _names_ride_the_rings()
    from fcap.kernel.layout import CTX_KEY, CTX_TEXT
    port = free_port()
    path = tmp_path / "named.pcapng"
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "--context", "-c", "42", "-w", str(path), *extra,
                     f"udp dst port {port}"])
    try:
        first, counted, given = send_while_given(fc, port, "fcap_ctxtext", CTX_TEXT)
        assert fc.wait() == 0, fc.stderr
    finally:
        fc.kill()
    own_path, own_id = own_cgroup()
    ((key, text),) = given.items()
    key = CTX_KEY.unpack(key)
    assert key.cgroup == own_id and text == f" cgroup={own_id} cgroup_path={own_path}", (key, text)
    pkts = packets(path)
    assert len(pkts) == 42 and all(p.comment.endswith(text) and p.cgroup_path == own_path for p in pkts)
    assert all(p.packet_id for p in pkts) and len({p.packet_id for p in pkts}) == 42, \
        "the perf buffer's records have ids of their own"
    assert first == 1, f"{first} records went through the perf buffer before the names were given (the first's)"
    assert counted - first <= 2, f"{counted - first} of the 40 after went through the perf buffer (at most an " \
                                 "expiry's asking: the rest the programs wrote)"


def test_a_namespace_named_while_fcap_runs_is_named_a_second_later(root, tmp_path):
    """The names given to the programs last a second, the file drain's blocks' options half of one: a network
    namespace given its `ip netns` name while fcap runs is named in the record of a datagram sent from it 2.5 s
    later, not in the one sent before (the file rings where the kernel has them, else the perf buffer)."""
    if shutil.which("ip") is None or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("no ip, unshare or nsenter command")
    holder = subprocess.Popen(["unshare", "--net", "sleep", "120"])
    name = f"fcaplate{os.getpid() % 100000}"
    try:
        ns = f"/proc/{holder.pid}/ns/net"
        for _ in range(100):   # (unshare's own process becomes sleep once the namespace is made)
            if os.path.exists(ns) and os.stat(ns).st_ino != os.stat("/proc/self/ns/net").st_ino:
                break
            time.sleep(0.05)
        inum = os.stat(ns).st_ino
        sh("nsenter", f"--net={ns}", "ip", "link", "set", "lo", "up")
        port = free_port()
        path = tmp_path / "late.pcapng"
        fc = start_fcap(["-i", "tp_btf/net_dev_queue", "--context", "--netns", str(inum), "-c", "2", "-w",
                         str(path), f"udp dst port {port}"])
        code = "import socket, sys; socket.socket(2, 2).sendto(sys.argv[1].encode(), ('127.0.0.1', int(sys.argv[2])))"
        try:
            for payload in ("before", "after"):
                subprocess.run(["nsenter", f"--net={ns}", sys.executable, "-c", code, payload, str(port)], check=True,
                               timeout=30, env=subprocess_env())
                if payload == "before":
                    time.sleep(0.5)
                    sh("ip", "netns", "attach", name, str(holder.pid))
                    time.sleep(2.5)
            assert fc.wait() == 0, fc.stderr
        finally:
            fc.kill()
        got = {bytes(p.data[-6:]).lstrip(b"\x00").decode(errors="replace")[-6:]: p for p in packets(path)}
        before = next(p for k, p in got.items() if k.endswith("before"))
        after = next(p for k, p in got.items() if k.endswith("after"))
        assert before.netns == after.netns == inum
        assert before.netns_name is None and "netns_name=" not in before.comment, before.comment
        assert after.netns_name == name and after.comment.endswith(f" netns_name={name}"), after.comment
    finally:
        sh("ip", "netns", "del", name, check=False)
        holder.kill()
        holder.wait()


def test_the_api_and_printed_lines_carry_the_context(tree):
    """fcap.capture(context=True, container=...): the Packet's context; `fcap --context -l`: the printed line
    names the container after the point."""
    import fcap
    port = free_port()
    with fcap.capture("tp_btf/net_dev_queue", filter=f"udp dst port {port}", count=1, context=True,
                      container=ID[:8], timeout=30) as cap:
        send(tree, port, "", "", "own")          # not the container's: the kernel turns it away
        send(tree, port, "docker", "docker", "in")
        (p,) = list(cap)
    assert bytes(p.data[-2:]) == b"in" and (p.cgroup, p.container) == (tree.ids["docker"], f"docker:{ID}")
    assert p.cgroup_path == tree.rel["docker"] and f"cgroup_path={tree.rel['docker']}" in p.comment
    fc = start_fcap(["-i", "tp_btf/net_dev_queue", "--context", "-l", "-c", "1", f"udp dst port {port}"],
                    stdout=subprocess.PIPE)
    try:
        send(tree, port, "docker", "docker", "in")
        assert fc.wait() == 0, fc.stderr
        line = fc.p.stdout.read().decode()
    finally:
        fc.kill()
    assert f"container=docker:{ID}" in line and f"cgroup={tree.ids['docker']}" in line, line


IPS_DST_NAT = 0x20   # enum ip_conntrack_status


def _ip(u3: dict) -> str:
    return socket.inet_ntoa(u3["in"]["s_addr"].to_bytes(4, "big"))   # (fcap decodes a __be32 as network order)


def _port(u: dict) -> int:
    return u["udp"]["port"]


def test_ct_shows_the_nat_of_each_packet(root, tmp_path, tcpdump):
    """--ct over a real nftables DNAT rule: datagrams sent to an address that is rewritten to the veth peer's;
    at net_dev_queue the bytes are tcpdump's (to the peer) and each record's conntrack entry holds the original
    tuple (to the address sent to), the reply tuple (from the peer) and DST_NAT in its status. Where conntrack is a
    module (Debian's kernels), the rule loads it and the entry is typed from the module's BTF."""
    if shutil.which("nft") is None:
        pytest.skip("no nft command (Debian: nftables)")
    from bpf.btf import BTF
    from fcap.kernel.dumps import CT_MODULE
    from netns import make_veth_ns, remove_veth_ns
    v = make_veth_ns()
    table = f"fcapct{v.a}"
    try:
        base = int.from_bytes(socket.inet_aton(v.local), "big") - 1
        sent_to = socket.inet_ntoa(((base ^ 0x4000) + 2).to_bytes(4, "big"))   # another /30: routed to the pair
        port = free_port()
        sh("ip", "route", "add", f"{sent_to}/32", "dev", v.a)
        sh("nft", f"add table ip {table}; add chain ip {table} out {{ type nat hook output priority -100; }}; "
                  f"add rule ip {table} out ip daddr {sent_to} udp dport {port} dnat to {v.peer}")
        if BTF.vmlinux().find("nf_conn", "struct") is None and CT_MODULE not in BTF.module_names():
            r = run_fcap(["-i", "tp_btf/net_dev_queue", "--ct", "-c", "1", "-w", str(tmp_path / "no.pcapng")])
            err = r.stderr.decode()
            assert r.returncode != 0 and err.count("\n") == 1 and CT_MODULE in err, err   # one line, no file
            assert not (tmp_path / "no.pcapng").exists()
            pytest.skip(f"struct nf_conn is neither in vmlinux's BTF nor in a loaded {CT_MODULE}'s: {err.strip()}")
        fpath, tpath = tmp_path / "ct.pcapng", tmp_path / "t.pcap"
        td = start_tcpdump(v.a, tpath, f"udp dst port {port}")
        fc = start_fcap(["-i", "tp_btf/net_dev_queue", "--ifname", v.a, "--ct", "-c", "3", "-w", str(fpath),
                         f"udp dst port {port}"])
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for i in range(3):
                    s.sendto(b"nat%d" % i, (sent_to, port))
                sport = s.getsockname()[1]
            assert fc.wait() == 0, fc.stderr
        finally:
            fc.kill()
            td.stop()
        got, seen = packets(fpath), read_packets(tpath)
        assert [bytes(p.data[14:]) for p in got] == [p.l3 for p in seen] and len(got) == 3
        for p in got:
            ct = p.dumps["ct"]
            assert ct.error is None and ct.ctype == "struct nf_conn", ct.error
            c = ct.value
            orig, reply = (c["tuplehash"][d]["tuple"] for d in (0, 1))
            assert (_ip(orig["src"]["u3"]), _port(orig["src"]["u"])) == (v.local, sport)
            assert (_ip(orig["dst"]["u3"]), _port(orig["dst"]["u"])) == (sent_to, port)
            assert (_ip(reply["src"]["u3"]), _port(reply["src"]["u"])) == (v.peer, port)
            assert orig["dst"]["protonum"] == 17 and c["status"] & IPS_DST_NAT and c["zone"]["id"] == 0
            assert socket.inet_ntoa(bytes(p.data[30:34])) == v.peer     # the bytes: after the rewrite
        r = run_fcap(["-r", str(fpath), "--json"])
        objs = [json.loads(line) for line in r.stdout.decode().splitlines()]
        assert [o["dumps"]["ct"]["status"] for o in objs] == [p.dumps["ct"].value["status"] for p in got]
    finally:
        sh("nft", f"delete table ip {table}", check=False)
        remove_veth_ns(v)
