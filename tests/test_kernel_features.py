"""The feature matrix (README): each feature works on this kernel or is refused in one line naming the missing kernel
feature and the first kernel that has it. Probes decide, never version numbers. In tests/vm/run guests the report
is left in $FCAP_VM_OUT (tests/run collects them into the README's table); FCAP_FEATURES_OUT=DIR keeps it elsewhere."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a refusal names the kernel feature's first kernel, or a build option, or the policy that refuses it
NAMES_WHY = re.compile(r"Linux \d+\.\d+\+|CONFIG_[A-Z_]+|EPERM")
# what every kernel fcap supports (BTF, 5.5+) must do
BASE = ("tp_btf", "raw_tp", "filter", "predicates", "pidcomm")


def fcap(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fcap.commands.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT))


@pytest.fixture(scope="module")
def report():
    if os.geteuid() != 0:
        pytest.skip("needs root: the report loads and attaches programs")
    if shutil.which("modprobe"):   # a module with BTF to capture at, where veth is a module (the guests)
        subprocess.run(["modprobe", "-q", "veth"], capture_output=True, timeout=60)
    r = subprocess.run([sys.executable, "-m", "fcap.commands.probe_report", "--json"], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(ROOT))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    out = os.environ.get("FCAP_FEATURES_OUT") or (os.environ.get("FCAP_VM_OUT") if os.environ.get("FCAP_VM") else "")
    if out:
        os.makedirs(out, exist_ok=True)
        Path(out, f"features-{rep['kernel']}.json").write_text(json.dumps(rep) + "\n")
    return rep


def test_every_feature_works_or_says_why_in_one_line(report):
    from fcap.commands.probe_report import ROWS
    rows = {r["key"]: r for r in report["rows"]}
    assert list(rows) == [k for k, _t, _n in ROWS]
    for key, row in rows.items():
        assert "\n" not in row["detail"] and row["detail"], row
        if row["ok"] is False:
            assert NAMES_WHY.search(row["detail"]), f"{key}: the refusal does not name what is missing: {row}"
    bad = {k: rows[k]["detail"] for k in BASE if not rows[k]["ok"]}
    assert not bad, bad


def test_capture_refusals_are_one_line_and_name_the_kernel_feature(report, tmp_path):
    """The capture command itself refuses what the report says is missing, in one line saying why."""
    rows = {r["key"]: r for r in report["rows"]}
    tried = 0
    for key, argv in [("fentry", ["-i", "fentry/ip_output"]), ("fexit", ["-i", "fexit/ip_output"]),
                      ("kprobe", ["-i", "kprobe/ip_output"]), ("module", ["-i", "fentry/veth_xmit"])]:
        if rows[key]["ok"] is not False:
            continue
        r = fcap(*argv, "-w", str(tmp_path / "x.pcapng"), "--", "true")
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, (key, r.stderr)
        assert NAMES_WHY.search(lines[0]), (key, lines[0])
        assert not (tmp_path / "x.pcapng").exists()
        tried += 1
    if not tried:
        pytest.skip("this kernel refuses none of fentry, fexit, kprobe or module points")


def test_filter_on_linear_bytes_says_so(report, tmp_path):
    """Where tracing programs may not read page frags, a filtered capture says once that its filter sees the linear
    part only, and why."""
    row = {r["key"]: r for r in report["rows"]}["filter_frags"]
    if row["ok"]:
        pytest.skip("the filter reads page frags on this kernel")
    r = fcap("-i", "tp_btf/net_dev_queue", "-w", str(tmp_path / "x.pcapng"), "udp port 9", "--", "true")
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "linear" in ln]
    assert len(notes) == 1 and NAMES_WHY.search(notes[0]), r.stderr


def test_helper_probe_tells_unknown_disallowed_and_callable_apart(root):
    """bpf.probes.helper against what this kernel does: a helper id past the last one is unknown, a helper only
    for tracing programs is refused to raw_tp programs, a plain one is callable."""
    from bpf import probes
    from bpf.uapi import Helper
    unknown = probes.helper(100000)
    assert unknown is not None and "has no helper #100000" in unknown.reason, unknown
    assert probes.helper(Helper.ktime_get_ns) is None
    refused = probes.helper(Helper.get_func_ret)   # (fexit only, since 5.17; unknown before)
    assert refused is not None and ("may not call bpf_get_func_ret" in refused.reason
                                    or "has no bpf_get_func_ret helper (Linux 5.17+)" in refused.reason), refused
