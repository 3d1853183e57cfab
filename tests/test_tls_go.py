"""--tls-secrets and --tls-pid: a Go HTTPS client (net/http, no KeyLogWriter: it logs no keys) built here with
`go build`, its TLS secrets read by fcap's uprobe at crypto/tls.(*Config).writeKeyLog and written into the pcapng
file before the packets they decrypt; tshark, with no setting of its own, shows the request's path. The client
started by fcap (-- COMMAND) and one already running (--tls-pid PID); without the flag nothing is decrypted (the
test could fail), and another process running the same binary keeps its secrets. bpf.elf finds the function where
Go's own disassembler says it is. The refusals are one line."""

from __future__ import annotations

import os
import random
import re
import subprocess

import pytest
from conftest import need_root, need_tool
from netns import run_fcap, start_fcap

from bpf.elf import Elf, symbol_offset
from bpf.errors import ElfError, NoSymbol
from fcap.errors import FcapError
from fcap.host import gotls
from fcap.points import kinds

CLIENT = """package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
)

// client URL [wait]: GET URL (any certificate), print the status; with wait, first read a line from stdin.
func main() {
	if len(os.Args) > 2 && os.Args[2] == "wait" {
		bufio.NewReader(os.Stdin).ReadString('\\n')
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	r, err := c.Get(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	fmt.Println(r.StatusCode)
}
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> str:
    """The Go client, built with the local toolchain (no network: its cache, GOPATH and HOME in a temporary
    directory)."""
    go = need_tool("go", "the Go client of the --tls-secrets tests (apt-get install golang-go)")
    top = tmp_path_factory.mktemp("goclient")
    (top / "main.go").write_text(CLIENT)
    (top / "go.mod").write_text("module client\n\ngo 1.17\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(top), "GOCACHE": str(top / "cache"),
           "GOPATH": str(top / "gopath"), "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0",
           "GOPROXY": "off"}
    r = subprocess.run([go, "build", "-o", str(top / "client"), "."], cwd=top, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return str(top / "client")


def _paths(out) -> list[str]:
    """The paths of the HTTP requests tshark decrypts in the file."""
    r = subprocess.run([need_tool("tshark"), "-r", str(out), "-Y", "http.request", "-T", "fields", "-e",
                        "http.request.uri"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def _hellos(out) -> int:
    r = subprocess.run([need_tool("tshark"), "-r", str(out), "-Y", "tls.handshake.type == 1"], capture_output=True,
                       text=True, timeout=60)
    return len(r.stdout.splitlines())


def _path() -> str:
    return f"/fcap-go-{random.randrange(10**6)}/secret-path"


def _capture(addr: str, port: int, out) -> list[str]:
    return ["-i", "tp_btf/net_dev_queue", "-w", str(out), f"tcp and host {addr} and port {port}"]


@pytest.mark.parametrize("with_flag", [True, False])
def test_tshark_decrypts_the_commands_request(https, client, with_flag, tmp_path):
    need_root()
    addr, port = https
    out, path = tmp_path / "go.pcapng", _path()
    flag = ["--tls-secrets"] if with_flag else []
    r = run_fcap(_capture(addr, port, out) + flag + ["--", client, f"https://{addr}:{port}{path}"])
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split() == ["404"]   # (the command's own output: the request went)
    assert _hellos(out) == 1
    assert (_paths(out) == [path]) == with_flag


def test_tshark_decrypts_the_request_of_a_running_process(https, client, tmp_path):
    need_root()
    addr, port = https
    out, path = tmp_path / "go-pid.pcapng", _path()
    go = subprocess.Popen([client, f"https://{addr}:{port}{path}", "wait"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE)
    fcap = None
    try:
        fcap = start_fcap(_capture(addr, port, out) + ["--tls-pid", str(go.pid)])
        go.communicate(b"go\n", timeout=30)   # (the process was running before fcap: its request comes now)
    finally:
        go.kill() if go.poll() is None else None
        rc = fcap.stop() if fcap is not None else None
    assert go.returncode == 0 and rc == 0, fcap.stderr
    assert _paths(out) == [path]


def test_another_process_of_the_same_program_keeps_its_secrets(https, client, tmp_path):
    need_root()
    addr, port = https
    out, mine, theirs = tmp_path / "go-two.pcapng", _path(), _path()
    other = subprocess.Popen([client, f"https://{addr}:{port}{theirs}", "wait"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    fcap = None
    try:   # (the command waits for a line on fcap's stdin, which it inherits)
        fcap = start_fcap(_capture(addr, port, out) + ["--tls-secrets", "--", client,
                                                       f"https://{addr}:{port}{mine}", "wait"], stdin=subprocess.PIPE)
        other.communicate(b"go\n", timeout=30)   # (its request while fcap's uprobe is on the same file)
        fcap.p.stdin.write(b"go\n")
        fcap.p.stdin.close()
        rc = fcap.wait()   # (the command's exit ends the capture)
    finally:
        other.kill() if other.poll() is None else None
        if fcap is not None:
            fcap.kill()
    assert other.returncode == 0 and rc == 0, fcap.stderr
    assert _hellos(out) == 2   # both requests are in the file; only the command's is decrypted
    assert _paths(out) == [mine]


def test_elf_offset_is_where_go_disassembles_the_function(client):
    """bpf.elf's offset holds the bytes `go tool objdump` shows at the function's first instruction."""
    go = need_tool("go")
    r = subprocess.run([go, "tool", "objdump", "-s", re.escape(gotls.SYMBOL) + "$", client], capture_output=True,
                       text=True, timeout=120)
    first = next(ln for ln in r.stdout.splitlines() if ln.startswith("  "))
    want = bytes.fromhex(first.split("\t")[3])
    offset = symbol_offset(client, gotls.SYMBOL)
    with open(client, "rb") as f:
        f.seek(offset)
        assert f.read(len(want)) == want, first
    with Elf(client) as elf:
        assert elf.symbol(gotls.SYMBOL).size > len(want)


def test_elf_errors_are_typed(tmp_path):
    with pytest.raises(NoSymbol) as e:
        symbol_offset("/bin/true", gotls.SYMBOL)
    assert e.value.path == "/bin/true" and e.value.name == gotls.SYMBOL and e.value.errno is None
    (tmp_path / "text").write_text("#!/bin/sh\n")
    with pytest.raises(ElfError, match="not a 64-bit little-endian ELF"):
        symbol_offset(str(tmp_path / "text"), "main")
    with pytest.raises(ElfError) as e:
        symbol_offset(str(tmp_path / "none"), "main")
    assert e.value.errno == 2


def test_records_become_key_log_lines_of_the_process_only():
    rnd, secret = bytes(range(32)), bytes(range(100, 148))
    rec = gotls.RECORD.pack(42, 23, 32, 48, b"CLIENT_TRAFFIC_SECRET_0", rnd, secret)
    assert gotls.key_log_line(rec, 42) == b"CLIENT_TRAFFIC_SECRET_0 %s %s\n" % (rnd.hex().encode(),
                                                                              secret.hex().encode())
    assert gotls.key_log_line(rec, 43) == b"" and gotls.key_log_line(rec, 0) == b""
    unread = gotls.RECORD.pack(42, 0, 32, 48, b"", rnd, secret)   # (the label's read failed)
    assert gotls.key_log_line(unread, 42) == b""


def test_arguments_offsets_are_read_from_btf():
    machine = kinds.machine()
    if machine not in gotls.GO_ARGS:
        pytest.skip(f"fcap knows Go's registers on {', '.join(gotls.GO_ARGS)}, not on {machine}")
    offsets = gotls.context_offsets(machine)
    assert set(offsets) == set(gotls.GO_ARGS["x86_64"]) and len(set(offsets.values())) == 6
    if machine == "x86_64":   # (struct pt_regs: r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di ...)
        assert offsets == {"label": 40, "label_len": 88, "random": 112, "random_len": 104, "secret": 64,
                           "secret_len": 56}
    else:   # (arm64: struct user_pt_regs { u64 regs[31]; ... })
        assert offsets == {"label": 8, "label_len": 16, "random": 24, "random_len": 32, "secret": 48,
                           "secret_len": 56}
    with pytest.raises(FcapError, match="does not know where Go passes arguments on riscv64") as e:
        gotls.context_offsets("riscv64")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("args, words", [
    (["-w", "x.pcapng", "--tls-secrets", "--", "/bin/true"],
     f"--tls-secrets: /bin/true has no {gotls.SYMBOL} (not a Go program using crypto/tls, or stripped)"),
    (["-w", "x.pcapng", "--tls-secrets"], "--tls-secrets: whose secrets? -- COMMAND, or --tls-pid PID"),
    (["-w", "x.pcapng", "--tls-secrets", "--pid", "1"], "--pid keeps only the packets handled in PID"),
    (["-w", "x.pcap", "--tls-secrets", "--", "/bin/true"], "--tls-secrets: only pcapng holds secrets"),
    (["--tls-pid", "1", "-nn"], "--tls-pid: only pcapng holds secrets"),
    (["-w", "x.pcapng", "-C", "1", "--tls-secrets", "--", "/bin/true"], "--tls-secrets: one file, not a -C/-G"),
    (["-w", "x.pcapng", "--tls-pid", str(2**22 + 1)], f"--tls-pid {2**22 + 1}: no such process"),
    (["-w", "x.pcapng", "--tls-pid", "1", "--", "/bin/true"], "--tls-pid PID or -- COMMAND, not both"),
    (["-w", "x.pcapng", "--tls-secrets", "--", "fcap-no-such-command"], "fcap-no-such-command: command not found"),
])
def test_tls_secrets_errors_are_one_line(args, words, root, tmp_path):
    r = run_fcap(["-i", "tp_btf/net_dev_queue", *args], cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode != 0 and len(err.splitlines()) == 1 and words in err, err
    assert not list(tmp_path.iterdir())   # (no file left behind)


def test_dump_ebpf_shows_the_uprobes_program(root):
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "--tls-pid", "77", "--dump-ebpf"])
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    assert f"; --tls-secrets: a uprobe at the entry of {gotls.SYMBOL}" in out
    assert "if r0 != 0x4d goto out" in out and "call bpf_perf_event_output" in out   # (only process 77's)
