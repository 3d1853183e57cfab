"""Every way the fcap command can be used wrongly ends with ONE line `fcap: ...` on stderr, a non-zero exit
status and no traceback; list-devices, info and --dump-ebpf print what they promise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import kernel_refusal, need_tool

from netns import fcap_argv, run_fcap, subprocess_env


def one_line_error(r: subprocess.CompletedProcess, status: int | None = None) -> str:
    """The single `fcap: ...` line of a failed run (asserting everything else about it)."""
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode != 0, f"exit status 0 for an error; stderr: {err!r}"
    if status is not None:
        assert r.returncode == status, f"exit status {r.returncode}, not {status}; stderr: {err!r}"
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, f"{len(lines)} lines on stderr, not one:\n{err}"
    assert lines[0].startswith("fcap: "), lines[0]
    return lines[0]


# ---- arguments -------------------------------------------------------------------------------------------------

CAPTURE = ["-i", "tp_btf/net_dev_queue"]


@pytest.mark.parametrize("args,status,words", [
    (["-i", "fentry/no_such_fn"], 1, ["fentry/no_such_fn", "no kernel function", "no_such_fn"]),
    (["-i", "tp_btf/no_such_tp"], 1, ["tp_btf/no_such_tp", "no tracepoint", "no_such_tp"]),
    (["-i", "raw_tp/no_such_tp"], 1, ["raw_tp/no_such_tp", "no tracepoint"]),
    (["-i", "fentry/schedule"], 1, ["fentry/schedule", "no struct sk_buff * parameter"]),
    (["-i", "tp_btf/net_dev_queue:nope"], 1, ["'nope'", "there are: skb"]),
    (["-i", "foo/bar"], 1, ["foo/bar", "unknown attach kind 'foo'", "tp_btf"]),
    (["-i", "tp/net_dev_queue"], 1, ["tp/SUBSYSTEM/NAME"]),
    (["-i", "kretprobe/ip_output"], 1, ["fexit/ip_output"]),
    (["-i", ""], 1, ["empty capture point"]),
    (["-i", "fentry/"], 1, ["no function or tracepoint name"]),
    (CAPTURE + ["-y", "NOPE"], 1, ["unknown linktype 'NOPE'", "EN10MB"]),
    (CAPTURE + ["-s", "abc"], 2, ["invalid snaplen 'abc'", "not a number"]),
    (CAPTURE + ["-s", "-5"], 2, ["invalid snaplen '-5'"]),
    (CAPTURE + ["-s", "99999999999"], 2, ["invalid snaplen", "too large"]),
    (CAPTURE + ["-c", "0"], 2, ["invalid packet count '0'", "at least 1"]),
    (CAPTURE + ["-c", "x"], 2, ["invalid packet count 'x'", "not a number"]),
    (CAPTURE + ["-B", "0"], 2, ["invalid buffer size '0'"]),
    (CAPTURE + ["tcp", "port"], 1, ["tcp port", "syntax error"]),
    (CAPTURE + ["udp", "port", "99999"], 1, ["udp port 99999", "port"]),
    (CAPTURE + ["-F", "/nonexistent/filter"], 1, ["/nonexistent/filter", "No such file or directory"]),
    (CAPTURE + ["-C", "1k", "-w", "x"], 2, ["invalid file size '1k'", "a whole number"]),   # (as tcpdump 4.99.3)
    (CAPTURE + ["-C", "0", "-w", "x"], 2, ["invalid file size '0'", "at least 1"]),
    (CAPTURE + ["-C", "1", "-W", "0", "-w", "x"], 2, ["invalid number of output files '0'"]),
    (CAPTURE + ["-G", "-1", "-w", "x"], 2, ["invalid number of seconds '-1'"]),
    (CAPTURE + ["-C", "1", "-w", "-"], 2, ["-C and -G", "-w FILE, not stdout"]),
    (["-w", "x.pcap"], 2, ["no capture point", "-i POINT"]),
    ([], 2, ["no capture point"]),
])
def test_usage_errors(args, status, words, tmp_path):
    """Mistakes found before anything is loaded: no root needed, one line each."""
    r = run_fcap(args, cwd=tmp_path)
    line = one_line_error(r, status)
    for w in words:
        assert w in line, f"{w!r} not in {line!r}"


def test_option_without_value():
    """argparse's own errors (usage, then `fcap: error: ...`): non-zero, no traceback, the cause last."""
    r = run_fcap(["-i"])
    err = r.stderr.decode()
    assert r.returncode == 2 and "Traceback" not in err
    assert re.search(r"^fcap: error: argument -i.*expected one argument$", err, re.M), err


def test_unwritable_output(root):
    r = run_fcap(CAPTURE + ["-w", "/nonexistent/dir/x.pcap"])
    line = one_line_error(r)
    assert "/nonexistent/dir/x.pcap" in line and "No such file or directory" in line, line


def test_output_is_a_directory(root, tmp_path):
    r = run_fcap(CAPTURE + ["-w", str(tmp_path)])
    line = one_line_error(r)
    assert str(tmp_path) in line and "Is a directory" in line, line


def test_read_errors(tmp_path):
    line = one_line_error(run_fcap(["-r", str(tmp_path / "missing.pcap")]))
    assert "missing.pcap" in line and "No such file or directory" in line, line
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"this is not a capture file\n" * 4)
    line = one_line_error(run_fcap(["-r", str(junk)]))
    assert "junk.pcap" in line and "unknown file format" in line, line   # (libpcap's words)


# ---- the kernel or the machine says no ----------------------------------------------------------------------------

def test_without_privilege(root, tmp_path):
    """Root without capabilities (setpriv drops every one): bpf() is refused; the line says what is needed."""
    need_tool("setpriv", "drops the capabilities fcap needs")
    r = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-all", *fcap_argv(), *CAPTURE,
                        "-w", str(tmp_path / "x.pcap")], capture_output=True, timeout=60, env=subprocess_env())
    line = one_line_error(r)
    assert re.search(r"not permitted|permission", line, re.I), line
    assert "root" in line and "CAP_BPF" in line, line


def test_as_nobody(root, tmp_path):
    """As user nobody: the same refusal. Needs an interpreter nobody can run (not one under /root)."""
    need_tool("setpriv", "switches to user nobody")
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run(drop + [sys.executable, "-c", "import fcap.commands.cli"], capture_output=True, timeout=60,
                           env=subprocess_env(), cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable} with fcap importable "
                    f"({probe.stderr.decode().strip().splitlines()[-1] if probe.stderr else probe.returncode})")
    os.chmod(tmp_path, 0o777)
    r = subprocess.run(drop + [sys.executable, "-m", "fcap.commands.cli", *CAPTURE, "-w", str(tmp_path / "x.pcap")],
                       capture_output=True, timeout=60, env=subprocess_env(), cwd="/")
    line = one_line_error(r)
    assert re.search(r"not permitted|permission", line, re.I) and "root" in line, line


def _without_btf(argv: list[str]) -> subprocess.CompletedProcess:
    """Run fcap ARGV in a private mount namespace where /sys/kernel/btf is an empty tmpfs: a kernel without BTF,
    as far as fcap can tell."""
    need_tool("unshare", "hides /sys/kernel/btf in a private mount namespace")
    script = 'mount -t tmpfs none /sys/kernel/btf && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           *fcap_argv(), *argv], capture_output=True, timeout=60, env=subprocess_env())


@pytest.mark.parametrize("argv,words", [
    (CAPTURE + ["-w", "/dev/null"], ["no BTF", "/sys/kernel/btf/vmlinux", "CONFIG_DEBUG_INFO_BTF"]),
    (["list-devices"], ["BTF", "/sys/kernel/btf/vmlinux"]),
    (["info", "ip_send_skb"], ["BTF", "/sys/kernel/btf/vmlinux"]),
])
def test_no_btf(root, argv, words):
    r = _without_btf(argv)
    if r.returncode != 0 and b"mount" in r.stderr and b"fcap" not in r.stderr:
        pytest.skip(f"cannot hide /sys/kernel/btf here: {r.stderr.decode().strip()}")
    line = one_line_error(r)
    for w in words:
        assert w in line, f"{w!r} not in {line!r}"


@pytest.mark.parametrize("kind", ["fentry", "fexit", "kprobe"])
def test_refused_hook_names_the_cause_and_a_tracepoint(root, tmp_path, kind):
    """Where the kernel refuses a kind of hook, fcap says so, why, and which tracepoint sees the same packets."""
    reason = kernel_refusal(kind)
    if reason is None:
        pytest.skip(f"this kernel allows {kind} programs (tests/test_capture.py captures with them)")
    out = tmp_path / "x.pcap"
    r = run_fcap(["-i", f"{kind}/ip_output", "-w", str(out)])
    line = one_line_error(r)
    assert line.startswith(f"fcap: {kind}/ip_output: "), line
    if "EPERM" in reason:
        assert "EPERM" in line, line
    if kind == "kprobe" and "CONFIG_KPROBES" in reason:
        assert "CONFIG_KPROBES" in line, line
    assert "tp_btf/net_dev_queue" in line, line


def test_bare_function_uses_the_best_hook_or_says_why_not(root):
    """`-i ip_output` alone: where neither fentry nor kprobe is allowed, the refusal line as for fentry."""
    if kernel_refusal("fentry") is None or kernel_refusal("kprobe") is None:
        pytest.skip("this kernel allows fentry or kprobe: a bare function name attaches")
    line = one_line_error(run_fcap(["-i", "ip_output", "-w", "/dev/null"]))
    assert "ip_output" in line and "tp_btf/net_dev_queue" in line, line


# ---- privilege edges: what is missing, in one line -----------------------------------------------------------

def _send_cmd(port: int) -> list[str]:
    """A command (after --) that sends a few datagrams to 127.0.0.1:port, without privileges of its own."""
    return ["--", sys.executable, "-c", "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"[s.sendto(b'x' * 10, ('127.0.0.1', {port})) for _ in range(5)]"]


def _with_caps(caps: str, argv: list[str]) -> subprocess.CompletedProcess:
    """fcap ARGV as root whose capabilities are changed by setpriv's CAPS (e.g. "-bpf,-sys_admin")."""
    need_tool("setpriv", "changes the capabilities fcap runs with")
    r = subprocess.run(["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *fcap_argv(), *argv],
                       capture_output=True, timeout=60, env=subprocess_env())
    if r.returncode != 0 and r.stderr.startswith(b"setpriv:"):
        pytest.skip(f"setpriv cannot set {caps} here: {r.stderr.decode().strip()}")
    return r


@pytest.mark.parametrize("caps,lacks,has", [
    ("-bpf,-sys_admin", "CAP_BPF", "CAP_PERFMON"),
    ("-perfmon,-sys_admin", "CAP_PERFMON", "CAP_BPF"),
])
def test_one_capability_missing_is_named(root, caps, lacks, has):
    """Root without CAP_BPF (CAP_PERFMON kept), or without CAP_PERFMON (CAP_BPF kept), CAP_SYS_ADMIN gone
    (it stands for both): the line names the missing one and the one it has."""
    line = one_line_error(_with_caps(caps, CAPTURE + ["-w", "/dev/null"]))
    assert f"lacks {lacks} (it has {has})" in line and "root" in line, line
    assert "refuses tp_btf programs" not in line, line   # (not the kernel's policy: a capability)


def test_cap_bpf_and_cap_perfmon_are_enough(root):
    """With CAP_BPF and CAP_PERFMON alone (no CAP_SYS_ADMIN, no other capability) the capture runs."""
    from netns import free_port
    port = free_port()
    r = _with_caps("-all,+bpf,+perfmon", CAPTURE + ["-c", "1", "-w", "/dev/null", f"udp port {port}",
                                                    *_send_cmd(port)])
    err = r.stderr.decode()
    if r.returncode != 0 and "perf buffer" in err and "EACCES" in err:
        with open("/proc/sys/kernel/perf_event_paranoid") as f:
            paranoid = f.read().strip()
        pytest.skip(f"this kernel (perf_event_paranoid {paranoid}) wants more than CAP_PERFMON for CPU-wide perf "
                    f"events: {err.strip()}")
    assert r.returncode == 0 and "1 packet captured" in err, err


def test_in_a_user_namespace(root):
    """Root inside a new user namespace (unshare -U -r) has every capability there, none for bpf(): one line
    saying so."""
    need_tool("unshare", "makes a user namespace")
    r = subprocess.run(["unshare", "--user", "--map-root-user", *fcap_argv(), *CAPTURE, "-w", "/dev/null"],
                       capture_output=True, timeout=60, env=subprocess_env())
    if r.returncode != 0 and r.stderr.startswith(b"unshare:"):
        pytest.skip(f"cannot make a user namespace here: {r.stderr.decode().strip()}")
    line = one_line_error(r)
    assert "user namespace" in line and "initial user namespace" in line, line


def _with_btf_mount(script: str, argv: list[str]) -> subprocess.CompletedProcess:
    """fcap ARGV in a private mount namespace after the shell SCRIPT changed /sys/kernel/btf there."""
    need_tool("unshare", "changes /sys/kernel/btf in a private mount namespace")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{script} && exec "$@"',
                        "sh", *fcap_argv(), *argv], capture_output=True, timeout=60, env=subprocess_env())
    if r.returncode != 0 and b"mount" in r.stderr and b"fcap" not in r.stderr:
        pytest.skip(f"cannot change /sys/kernel/btf here: {r.stderr.decode().strip()}")
    return r


def test_read_only_btf_is_enough(root):
    """/sys/kernel/btf mounted read-only: fcap only reads it, and captures."""
    from netns import free_port
    port = free_port()
    r = _with_btf_mount("mount --bind /sys/kernel/btf /sys/kernel/btf && "
                        "mount -o remount,bind,ro /sys/kernel/btf && "
                        "grep -q ' /sys/kernel/btf sysfs ro[ ,]' /proc/self/mounts",
                        CAPTURE + ["-c", "1", "-w", "/dev/null", f"udp port {port}", *_send_cmd(port)])
    err = r.stderr.decode()
    assert r.returncode == 0 and "1 packet captured" in err, err


def test_empty_btf_is_one_line(root):
    """/sys/kernel/btf/vmlinux empty (/dev/null bound over it): one line about the kernel's BTF."""
    line = one_line_error(_with_btf_mount("mount --bind /dev/null /sys/kernel/btf/vmlinux",
                                          CAPTURE + ["-w", "/dev/null"]))
    assert "BTF" in line and "vmlinux" in line, line


# ---- list-devices, info, --dump-ebpf ----------------------------------------------------------------------------

def test_list_devices(root):
    r = run_fcap(["list-devices"])
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    specs = {ln.split()[0] for ln in out.splitlines() if ln.strip()}
    assert {"tp_btf/net_dev_queue", "tp_btf/netif_receive_skb", "fentry/ip_output"} <= specs
    assert re.search(r"^fentry/ip_output  int ip_output\(struct net \*net, struct sock \*sk, struct sk_buff \*skb\)",
                     out, re.M), "ip_output's line"
    assert "fentry/schedule " not in out
    err = r.stderr.decode()
    assert "Traceback" not in err
    refused = [k for k in ("fentry", "kprobe") if kernel_refusal(k) is not None]
    if refused:
        # one note on stderr naming what this kernel refuses, pointing at tracepoints
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("fcap: "), err
        for k in refused:
            assert k in lines[0], f"{k} not in the note: {lines[0]}"
        assert "tp_btf/" in lines[0], lines[0]
    else:
        assert err == "", err


def test_list_devices_json():
    r = run_fcap(["list-devices", "ip_*", "--json"])
    assert r.returncode == 0, r.stderr.decode()
    items = json.loads(r.stdout)
    assert items and all(set(i) >= {"point", "kind", "name", "module", "prototype"} for i in items)
    names = {i["name"] for i in items}
    assert {"ip_output", "ip_send_skb", "ip_rcv"} <= names
    assert all(i["name"].startswith("ip_") for i in items)
    assert all("struct sk_buff *" in i["prototype"] for i in items)


def test_list_devices_no_match():
    """A pattern nothing matches: non-zero, and the error is the last line. (Where the kernel refuses fentry or
    kprobe, the refusal note currently comes first: two lines, not one; see test_list_devices for the note.)"""
    r = run_fcap(["list-devices", "zz_no_such_point_*"])
    err = r.stderr.decode()
    assert r.returncode != 0 and "Traceback" not in err, err
    lines = err.splitlines()
    assert lines and all(ln.startswith("fcap: ") for ln in lines) and len(lines) <= 2, err
    assert lines[-1] == "fcap: no capture point matches 'zz_no_such_point_*'", err
    assert r.stdout == b""


def test_info():
    r = run_fcap(["info", "ip_send_skb"])
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines()[0] == "int ip_send_skb(struct net *net, struct sk_buff *skb);"
    r = run_fcap(["info", "tp_btf/net_dev_queue"])
    assert r.returncode == 0 and "net_dev_queue(struct sk_buff *skb)" in r.stdout.decode(), r.stdout


def test_info_unknown():
    line = one_line_error(run_fcap(["info", "no_such_function_x"]))
    assert "no_such_function_x" in line, line


@pytest.mark.parametrize("point", ["tp_btf/net_dev_queue", "fentry/ip_output", "raw_tp/netif_receive_skb"])
def test_dump_ebpf(point):
    """--dump-ebpf prints the generated program without loading it (so also where fentry is refused)."""
    r = run_fcap(["-i", point, "--dump-ebpf", "udp"])
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert out.startswith(f"; {point}: "), out[:200]
    assert "call bpf_skb_output" in out or "call bpf_perf_event_output" in out, out
    if point.startswith("tp_btf") or point.startswith("fentry"):
        assert "call bpf_skb_output" in out       # typed contexts: frags too, through the helper
    assert re.search(r"^\s+\d+: exit$", out, re.M), out
