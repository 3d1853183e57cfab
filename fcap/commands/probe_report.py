"""`fcap features`: what fcap can do on this kernel, each capability probed for real (load, attach: bpf.probes) and
reported as one line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NamedTuple

from fcap.points import pointcaps

# (key, feature, what it needs): the rows of README's feature matrix, in its order. "needs" names the kernel
# feature and the first mainline kernel that has it; whether a kernel has it is decided by trying, never by version.
ROWS = [
    ("tp_btf", "`tp_btf/NAME` capture: packet with its frags, pcapng metadata", "5.5: BTF tracepoints, bpf_skb_output"),
    ("fentry", "`fentry/FUNC` capture", "5.5: BPF trampolines (and no policy refusing them)"),
    ("fexit", "`fexit/FUNC` capture (`--where 'return ...'`)", "5.5: BPF trampolines"),
    ("raw_tp", "`raw_tp/NAME` capture (linear bytes)", "4.17: raw tracepoints"),
    ("kprobe", "`kprobe/FUNC` capture (linear bytes)", "CONFIG_KPROBES"),
    ("module", "points in modules (`fentry/veth_xmit`)", "5.11: module BTF (CONFIG_DEBUG_INFO_BTF_MODULES)"),
    ("filter", "filter in the kernel (`'udp port 53'`)", "5.5 (as tp_btf)"),
    ("predicates", "predicates (`--pid --comm --ifname --netns --where`)", "5.5 (as tp_btf)"),
    ("pidcomm", "pid/tid and comm per packet", "4.2: helpers; 5.11: bpf_get_current_task_btf (faster)"),
    ("filter_in_place", "filter reads packet bytes in place (`skb->head`), no copy",
     "6.17: skb->head typed as untrusted memory; a copy before"),
    ("filter_frags", "filter reads page frags", "6.12: bpf_dynptr_from_skb kfunc for tracing programs"),
    ("file_rings", "program writes file records itself (file rings)",
     "5.5: mmapable arrays (elsewhere than x86-64, 5.12: atomics); packets with bytes in page frags: 6.12 (the kfunc)"),
    ("ringbuf", "BPF ring buffer maps", "5.8"),
    ("tracing_multi", "many fentry/fexit points, one program and link (`-i 'fentry/*'`)",
     "7.2 (the first seen here): tracing-multi links, BPF_TRACE_FENTRY_MULTI"),
    ("kprobe_multi", "many kprobe points, one program and link (`-i 'kprobe/*'`)",
     "5.18: kprobe-multi links with attach cookies"),
    ("bpf_programs", "an XDP or tc program's entry and exit, its verdict (`-i xdp/PROG`)",
     "5.5: fentry/fexit on BPF programs (BPF trampolines)"),
]
FIRST = {"filter_frags": "6.12", "file_rings": "6.12"}   # (commit ffc83860d8c0, Sept. 2024)


class Result(NamedTuple):
    key: str
    ok: bool | None  # None: nothing to try here
    detail: str      # one line: how it works here, or why not


def _capture(spec: str, filter: str | None = None, predicates: list | None = None, record: str = "pcapng"):
    """Load and attach (then close) the capture program fcap would use for spec; "file rings" when the program
    writes its records there."""
    from fcap.kernel.layout import RECORD_PCAP, RECORD_PCAPNG
    from fcap.live.session import Config, Session
    s = Session(Config(points=[spec], filter=filter, predicates=predicates or [],
                       record=RECORD_PCAPNG if record == "pcapng" else RECORD_PCAP,
                       file_ring=record == "pcap"))
    try:
        s.open()
        s.attach()
        return "" if s.ring is None else "file rings"
    finally:
        s.close()


def _try(key: str, fn) -> Result:
    from fcap.points.spec import PointError
    from fcap.live.session import CaptureError
    try:
        detail = fn()
        return Result(key, True, detail or "yes")
    except (CaptureError, PointError) as e:
        return Result(key, False, str(e).splitlines()[0] if str(e) else type(e).__name__)


def check_capture(key: str, spec: str) -> Result:
    return _try(key, lambda: _capture(spec))


def check_module() -> Result:
    """A capture at a module's function (veth's, when veth is loaded), where modules carry BTF."""
    from bpf.btf import BTF
    mods = BTF.module_names()
    if mods:
        if "veth" not in mods:
            return Result("module", None, f"{len(mods)} modules have BTF; veth is not loaded: no capture tried")
        n = f"{len(mods)} module{'s' if len(mods) > 1 else ''}"
        return _try("module", lambda: _capture("fentry/veth_xmit") or f"yes ({n} with BTF)")
    loaded = []
    try:
        with open("/proc/modules") as f:
            loaded = [ln.split()[0] for ln in f if ln.strip()]
    except OSError:
        pass
    if not loaded:
        return Result("module", None, "no module loaded (network drivers built in)")
    return Result("module", False, f"no module has BTF ({len(loaded)} loaded): this kernel has no module BTF "
                                   f"(CONFIG_DEBUG_INFO_BTF_MODULES, Linux 5.11+); capture at vmlinux points")


def check_pidcomm() -> Result:
    from bpf import probes
    from bpf.uapi import Helper

    from fcap.live.session import Config, Session
    s = Session(Config(points=["tp_btf/net_dev_queue"]))
    try:
        s.resolve()
    except Exception as e:  # noqa: BLE001 - reported as the row's reason
        return Result("pidcomm", False, str(e))
    p = s.points[0]
    if pointcaps.task_btf(p):
        return Result("pidcomm", True, "yes (bpf_get_current_task_btf)")
    r = _try("pidcomm", lambda: _capture("tp_btf/net_dev_queue"))
    if not r.ok:
        return r
    why = probes.helper(Helper.get_current_task_btf, p.kind.prog_type, p.kind.attach_type, p.btf_id,
                          label=f"{p.kind} programs")   # (what pointcaps.task_btf asked: cached)
    reason = why.reason if why is not None else "not callable from tp_btf programs"
    return Result("pidcomm", True, f"yes, through get_current_pid_tgid + get_current_comm: {reason}")


def check_filter_frags(key: str) -> Result:
    from fcap.live.session import Config, Session
    s = Session(Config(points=["tp_btf/net_dev_queue"], filter="udp", record="pcap", file_ring=True))
    try:
        s.resolve()
        kfunc = pointcaps.dynptr_kfunc(s.points[0])
    except Exception as e:  # noqa: BLE001
        return Result(key, False, str(e))
    from bpf.btf import BTF
    if not kfunc:
        have = BTF.vmlinux().find("bpf_dynptr_from_skb", "func") is not None
        why = ("tracing programs may not call bpf_dynptr_from_skb" if have else
               "this kernel has no bpf_dynptr_from_skb kfunc")
        if key == "file_rings":
            return check_file_rings(f"linear packets; those with bytes in page frags through the perf buffer: {why} "
                                    f"(Linux {FIRST[key]}+ lets tp_btf/fentry programs call it)")
        return Result(key, False, f"the filter sees the linear part only: {why} (Linux {FIRST[key]}+ lets "
                                  f"tp_btf/fentry programs call it)")
    if key == "filter_frags":
        return _try(key, lambda: _capture("tp_btf/net_dev_queue", filter="udp"))
    return check_file_rings("yes")


def check_file_rings(yes: str) -> Result:
    """A pcap capture at tp_btf/net_dev_queue: do its programs write the file rings? `yes`: what they hold if so."""
    r = _try("file_rings", lambda: _capture("tp_btf/net_dev_queue", record="pcap"))
    if r.ok and r.detail != "file rings":
        return Result("file_rings", False, "the file rings could not be made here (no atomics the programs can "
                                           "publish a record with): records go through the perf buffer")
    return Result("file_rings", r.ok, yes if r.ok else r.detail)


def check_in_place() -> Result:
    """A filtered capture at tp_btf/net_dev_queue: does its program read the packet's bytes in place, or (the
    verifier refusing that, or not typing skb->head) a copy of them?"""
    from fcap.live.session import CaptureError, Config, Session

    def fn():
        s = Session(Config(points=["tp_btf/net_dev_queue"], filter="udp port 53"))
        try:
            s.open()
            s.attach()
            if "head_loads" in s.fallbacks:
                raise CaptureError(f"the filter reads a copy (in place: Linux 6.17+, where the verifier takes the "
                                   f"program): {s.fallbacks['head_loads']}")
            if not pointcaps.head_loads(s.points[0]):
                raise CaptureError("the filter reads a copy: tracing programs may not load through skb->head here "
                                   "(Linux 6.17+ types it as untrusted memory)")
            return "yes"
        finally:
            s.close()
    return _try("filter_in_place", fn)


def filter_note(session) -> str:
    """One line for a capture whose filter sees only the linear part of packets at a BTF-typed point (no skb
    dynptr for tracing programs on this kernel); "" otherwise. (raw_tp and kprobe points are linear-only anyway.)"""
    if session.cbpf is None:
        return ""
    typed = [p for p in session.points if p.typed]
    if not typed or all(pointcaps.dynptr_kfunc(p) for p in typed):
        return ""
    from bpf.btf import BTF
    why = ("tracing programs may not call bpf_dynptr_from_skb here" if BTF.vmlinux().find("bpf_dynptr_from_skb", "func")
           else "this kernel has no bpf_dynptr_from_skb kfunc")
    return (f"note: the filter sees the linear part of each packet only, not bytes in page frags (TCP payload on lo, "
            f"GSO): {why} (Linux {FIRST['filter_frags']}+ lets tracing programs read them)")


def check_ringbuf() -> Result:
    from bpf import probes
    from bpf.uapi import MapType
    err = probes.map_type(MapType.RINGBUF)
    if err is None:
        return Result("ringbuf", True, "yes")
    return Result("ringbuf", False, f"no BPF_MAP_TYPE_RINGBUF: {err.reason} (Linux 5.8+)")


# Two functions of one group (same kind and skb argument: fcap.live.multi) for the multi-attach rows
MULTI_PAIR = ("ip_output", "ip_finish_output")


def check_multi(key: str, single) -> Result:
    """Two points of kind `single` (kinds.FENTRY or kinds.KPROBE) captured through one multi-attach program and
    link, where the probe of the multi kind says the kernel has it; else why not."""
    from fcap.live.session import Config, Session
    from fcap.points import kinds
    kind_name = single.name
    m = kinds.multi_for(single)[0]
    why = m.probe()
    if why is not None:
        return Result(key, False, f"{why.reason}; a program per point instead")

    def fn():
        s = Session(Config(points=[f"{kind_name}/{f}" for f in MULTI_PAIR]))
        try:
            s.open()
            s.attach()
            groups = [u for u in s.groups if u.kind is m]
            # (the other links: --track's ends of a packet's life, which several points attach)
            if not groups or len([link for link in s.links if link.what.startswith(m.name)]) != 1:
                raise CaptureError(f"{m.name}: the points were not attached through one link")
            return f"yes ({m.name}: {len(groups[0].points)} functions, one program, one link)"
        finally:
            s.close()
    from fcap.live.session import CaptureError
    return _try(key, fn)


def check_bpf_programs() -> Result:
    """A capture at the entry and exit of an XDP program fcap loads for the purpose (XDP_PASS, with BTF function
    info; multi-buffer where the kernel has it, so that the capture programs' frags branch is verified too),
    attached nowhere."""
    from bpf import asm
    from bpf.btf_write import BTFWriter
    from bpf.errors import BPFError
    from bpf.prog import load
    from bpf.uapi import ProgFlag, ProgType
    prog, frags = None, ""
    try:
        w, func = BTFWriter.one_function("fcap_probe_xdp", "xdp_md")
        with w.load() as btf:
            for flags in (ProgFlag.XDP_HAS_FRAGS, ProgFlag.NONE):
                try:
                    prog = load(ProgType.XDP, [asm.movi(asm.R0, 2), asm.exit_()], name="fcap_probe_xdp",
                                btf_fd=btf.fileno(), func_info=[(0, func)], prog_flags=flags)
                    frags = "; multi-buffer frags" if flags else ""
                    break
                except BPFError:
                    if not flags:
                        raise
    except BPFError as e:
        return Result("bpf_programs", False, f"cannot load an XDP program with BTF to try: {e}")
    with prog:
        return _try("bpf_programs", lambda: _capture(f"xdp/{prog.info().id}") or f"yes (entry, exit, verdict{frags})")


def report() -> list[Result]:
    """Every row of ROWS, tried on this kernel (as root)."""
    from fcap.kernel import predicates as pr
    from fcap.points import kinds
    checks = {
        "tp_btf": lambda: check_capture("tp_btf", "tp_btf/net_dev_queue"),
        "fentry": lambda: check_capture("fentry", "fentry/ip_output"),
        "fexit": lambda: _try("fexit", lambda: _capture(
            "fexit/ip_output", predicates=[lambda p: pr.where(p, "return == 0")])),
        "raw_tp": lambda: check_capture("raw_tp", "raw_tp/net_dev_queue"),
        "kprobe": lambda: check_capture("kprobe", "kprobe/ip_output"),
        "module": check_module,
        "filter": lambda: _try("filter", lambda: _capture("tp_btf/net_dev_queue", filter="udp port 53")),
        "predicates": lambda: _try("predicates", lambda: _capture("tp_btf/net_dev_queue", predicates=[
            lambda p: pr.pid(1), lambda p: pr.comm("ping"), lambda p: pr.ifname("lo"), lambda p: pr.netns(1),
            lambda p: pr.where(p, "skb->len > 100")])),
        "pidcomm": check_pidcomm,
        "filter_in_place": check_in_place,
        "filter_frags": lambda: check_filter_frags("filter_frags"),
        "file_rings": lambda: check_filter_frags("file_rings"),
        "ringbuf": check_ringbuf,
        "tracing_multi": lambda: check_multi("tracing_multi", kinds.FENTRY),
        "kprobe_multi": lambda: check_multi("kprobe_multi", kinds.KPROBE),
        "bpf_programs": check_bpf_programs,
    }
    return [checks[key]() for key, _f, _n in ROWS]


def kernel_name() -> str:
    return os.environ.get("FCAP_VM") or "host"


def kernel_version() -> str:
    """The upstream version: Debian's from uname -v ("... Debian 5.10.262-1 ..."), else uname -r's."""
    import re
    m = re.search(r"Debian (\d+\.\d+(?:\.\d+)?)", os.uname().version)
    return m.group(1) if m else re.split(r"[-+]", os.uname().release)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fcap features", description="what fcap can do on this kernel, tried for real")
    ap.add_argument("--json", action="store_true", help="one JSON object: kernel, release, rows")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="a Markdown matrix from --json outputs (no probing)")
    a = ap.parse_args(argv)
    if a.table:
        sys.stdout.write(table([json.load(open(p)) for p in a.table]))
        return 0
    if os.geteuid() != 0:
        sys.stderr.write("fcap features: needs root (it loads and attaches programs)\n")
        return 1
    rows = report()
    if a.json:
        json.dump({"kernel": kernel_name(), "release": os.uname().release, "version": kernel_version(),
                   "rows": [r._asdict() for r in rows]}, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(f"Linux {os.uname().release} ({kernel_version()}, {os.uname().machine})\n")
        titles = {k: f for k, f, _n in ROWS}
        for r in rows:
            mark = "n/a" if r.ok is None else "yes" if r.ok else "no"
            detail = "" if r.detail == "yes" else ": " + r.detail
            sys.stdout.write(f"{mark:3}  {titles[r.key].replace('`', '')}{detail}\n")
    return 0


def _cell(r: dict) -> str:
    d = r["detail"]
    if r["ok"] is None:
        return "n/a"
    if r["ok"]:
        if d.startswith("yes, through"):
            return "yes (helpers)"
        return "yes"
    if "EPERM" in d:
        return "refused (EPERM)"
    if "CONFIG_KPROBES" in d or "no kprobes" in d:
        return "no kprobes"
    return "no"


def _release(r: dict) -> str:
    """The kernel as a column names it: its full release (two builds of one version never look the same), with the
    upstream version where the release does not show it (Debian's 5.10.0-35-cloud-amd64 is 5.10.262)."""
    version, release = r.get("version"), r["release"]
    return f"{version}, {release}" if version and not release.startswith(version) else release


def table(reports: list[dict]) -> str:
    """README's matrix: a row per feature, a column per kernel; a cell that is not a plain yes is explained by
    its line below the table."""
    heads = [f"{r['kernel']} ({_release(r)})" for r in reports]
    out = ["| feature | " + " | ".join(heads) + " | needs |", "|---|" + "---|" * len(reports) + "---|"]
    notes: dict[str, list[str]] = {}
    byk = [{row["key"]: row for row in r["rows"]} for r in reports]
    for key, title, needs in ROWS:
        cells = []
        for rep, rows in zip(reports, byk):
            row = rows.get(key)
            if row is None:
                cells.append("?")
                continue
            cells.append(_cell(row))
            if _cell(row) != "yes":
                notes.setdefault(row["detail"], []).append(f"{rep['kernel']}: {title}")
        out.append(f"| {title} | " + " | ".join(cells) + f" | {needs} |")
    if notes:
        out.append("")
        for detail, where in notes.items():
            out.append(f"- {'; '.join(where)}: {detail}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
