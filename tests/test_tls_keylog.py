"""--tls-keylog FILE: an HTTPS request between Python's own client and server on 127.0.0.1, the client's SSLContext
logging its secrets to FILE as the capture runs; fcap writes them into its pcapng file as Decryption Secrets Blocks
before the packets they decrypt, and tshark, with no setting of its own, shows the request's path. Without the
flag the same traffic is not decrypted (the test could fail); pcap and printing refuse the flag in one line."""

from __future__ import annotations

import random
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest
from conftest import need_root, need_tool
from netns import run_fcap, start_fcap


def _get(addr: str, port: int, path: str, keylog) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if keylog is not None:
        ctx.keylog_filename = str(keylog)
    try:
        urllib.request.urlopen(f"https://{addr}:{port}{path}", context=ctx, timeout=10).read()
    except urllib.error.HTTPError as e:   # (a 404 for a path that is not there: the request went)
        assert e.code == 404


@pytest.mark.parametrize("with_keylog", [True, False])
def test_tshark_decrypts_the_request_with_the_files_secrets(https, with_keylog, tmp_path):
    need_root()
    tshark = need_tool("tshark")
    addr, port = https
    keylog, out = tmp_path / "keys.log", tmp_path / "tls.pcapng"
    path = f"/fcap-{random.randrange(10**6)}/secret-path"
    args = ["-i", "tp_btf/net_dev_queue", "-w", str(out), f"tcp and host {addr} and port {port}"]
    fcap = start_fcap(args + (["--tls-keylog", str(keylog)] if with_keylog else []))
    try:
        _get(addr, port, path, keylog)   # (the key log is written either way: only the flag differs)
    finally:
        rc = fcap.stop()
    assert rc == 0, fcap.stderr
    r = subprocess.run([tshark, "-r", str(out), "-Y", "http.request", "-T", "fields", "-e", "http.request.uri"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (r.stdout.split() == [path]) == with_keylog, r.stdout
    assert keylog.read_text().count("\n") >= 4


@pytest.mark.parametrize("args, words", [
    (["-w", "x.pcap"], "--tls-keylog: only pcapng holds secrets"),
    (["-w", "x.pcapng", "-C", "1"], "--tls-keylog: one file, not a -C/-G series"),
    ([], "--tls-keylog: only pcapng holds secrets"),
])
def test_tls_keylog_errors_are_one_line(args, words, root, tmp_path):
    r = run_fcap(["-i", "tp_btf/net_dev_queue", "--tls-keylog", "k.log", "-nn", *args], cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode != 0 and len(err.splitlines()) == 1 and words in err, err



