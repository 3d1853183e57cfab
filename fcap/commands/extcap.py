"""fcap as a Wireshark extcap: `fcap extcap` answers Wireshark's questions (--extcap-interfaces, --extcap-dlts,
--extcap-config, --extcap-capture-filter) and captures into the FIFO Wireshark gives (--capture --fifo), one
interface per capture point plus a configurable "any point" one; `fcap extcap --install` puts a launcher in the
personal extcap folder of the installed Wireshark and fcap's Lua dissector (fcap.* fields: fcap.commands.wireshark) in
its personal Lua plugins folder (`--uninstall` takes both away)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from fcap import __version__
from fcap.defaults import SNAPLEN
from fcap.errors import FcapError, UsageError

ANY = "fcap-any"
DEFAULT_POINT = "tp_btf/net_dev_queue"
# the interfaces of earlier versions (a tracepoint each): still answered, no longer listed
OLD_NAMES = {"fcap-net_dev_queue": "tp_btf/net_dev_queue", "fcap-net_dev_start_xmit": "tp_btf/net_dev_start_xmit",
             "fcap-netif_receive_skb": "tp_btf/netif_receive_skb", "fcap-kfree_skb": "tp_btf/kfree_skb"}
LAUNCHER = "fcap-extcap"
MARK = "# fcap extcap launcher"


class ExtcapError(FcapError):
    """An extcap request that cannot be answered (an unknown interface, no Wireshark to install into)."""


def interface_name(point: str) -> str:
    """The interface of a semantic point (dev:queue -> fcap-dev-queue)."""
    return "fcap-" + point.replace(":", "-")


def _interfaces() -> dict[str, str]:
    """Interface name -> point: one per semantic point (fcap list-devices --semantic), "" for the any-point one."""
    from fcap.points.semantic import TABLE
    out = {interface_name(name): name for name in TABLE}
    out[ANY] = ""
    return out


def _hook_name(point: str) -> str:
    """The kernel name a point is at (for a semantic point: its first hook's, which every other hook matches in
    whether a link-layer header is in place)."""
    from fcap.points.semantic import TABLE, is_semantic
    if is_semantic(point) and point in TABLE:
        point = TABLE[point][1][0][0]
    return point.rpartition("/")[2]


def _linktype(point: str):
    from fcap.files.linktypes import lookup
    from fcap.points.spec import is_device_point
    return lookup("EN10MB" if is_device_point(_hook_name(point)) else "LINUX_SLL2")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fcap extcap", description="fcap as a Wireshark extcap (see README.md)")
    p.add_argument("--extcap-interfaces", action="store_true")
    p.add_argument("--extcap-version", default="")
    p.add_argument("--extcap-interface", default="")
    p.add_argument("--extcap-dlts", action="store_true")
    p.add_argument("--extcap-config", action="store_true")
    p.add_argument("--extcap-capture-filter", default=None)
    p.add_argument("--extcap-reload-option", default=None)
    p.add_argument("--capture", action="store_true")
    p.add_argument("--fifo", default="")
    p.add_argument("--point", default="")
    p.add_argument("--snaplen", default="")
    p.add_argument("--where", action="append", default=[])
    for f in _features():   # (Wireshark's field per per-packet feature, its shorthands and settings)
        p.add_argument(f.flag, dest=f.name, **({"action": "append", "default": []} if f.metavar else
                                               {"action": "store_true"}))
        for s in f.shorthands:
            p.add_argument(s.flag, dest=s.name, action="store_true")
        for s in f.settings:
            p.add_argument(s.flag, dest=s.name, action="append", default=[])
    p.add_argument("--install", action="store_true",
                   help="put a launcher in Wireshark's personal extcap folder and the fcap.* fields' Lua dissector "
                        "in its personal Lua plugins folder")
    p.add_argument("--uninstall", action="store_true", help="remove them")
    p.add_argument("--dir", default="", help="the extcap folder (default: asked from tshark -G folders)")
    p.add_argument("--lua-dir", default="", help="the Lua plugins folder (default: asked from tshark -G folders)")
    return p


def main(argv: list[str], fcap_main) -> int:
    """`fcap extcap ...`: what Wireshark asks, or --install/--uninstall; a capture runs `fcap_main(argv)` (the
    command's main). Errors are FcapErrors (the CLI's line)."""
    args, unknown = _parser().parse_known_args(argv)
    if args.install or args.uninstall:
        return install(args.dir, args.lua_dir) if args.install else uninstall(args.dir, args.lua_dir)
    if args.extcap_interfaces:
        return _write(_list_interfaces())
    iface = args.extcap_interface
    if not iface:
        raise UsageError("fcap extcap: Wireshark's extcap interface (--extcap-interfaces, ...); "
                         "fcap extcap --install puts fcap into Wireshark")
    point = _point(iface, args.point)
    if args.extcap_dlts:
        return _write(_dlts(iface, point))
    if args.extcap_config:
        return _write(_config(iface))
    if args.capture:
        return capture(args, point, fcap_main)
    if args.extcap_capture_filter is not None:
        return _validate_filter(args.extcap_capture_filter, point)
    raise UsageError(f"fcap extcap: nothing asked for interface {iface} (unknown arguments: {' '.join(unknown)})")


def _point(iface: str, configured: str) -> str:
    listed = _interfaces()
    points = {**OLD_NAMES, **listed}
    if iface not in points:
        raise ExtcapError(f"no extcap interface {iface!r} (fcap's: {', '.join(listed)})")
    return points[iface] or configured or DEFAULT_POINT


def _write(text: str) -> int:
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


def _list_interfaces() -> str:
    lines = [f"extcap {{version={__version__}}}{{display=fcap: capture points inside the network stack}}\n"]
    from fcap.points.semantic import TABLE
    for name, (meaning, _hooks) in TABLE.items():
        lines.append(f"interface {{value={interface_name(name)}}}{{display=fcap: {name}, {meaning}}}\n")
    lines.append(f"interface {{value={ANY}}}{{display=fcap: any point (configure: point, snaplen, where, dump)}}\n")
    return "".join(lines)


def _dlts(iface: str, point: str) -> str:
    lt = _linktype(point)
    return f"dlt {{number={lt.number}}}{{name={iface}}}{{display={lt.description}}}\n"


def _config(iface: str) -> str:
    args = []
    if iface == ANY:
        args.append(("--point", "Capture point", "string", f"{{default={DEFAULT_POINT}}}{{required=true}}",
                     "a semantic point (dev:queue, skb:drop...: fcap list-devices --semantic) or fentry/FUNC, "
                     "fexit/FUNC, tp_btf/NAME, raw_tp/NAME, kprobe/FUNC (fcap list-devices)"))
    args += [
        ("--snaplen", "Snapshot length", "integer", f"{{range=1,{SNAPLEN}}}{{default={SNAPLEN}}}",
         "bytes kept of each packet"),
        ("--where", "Where (PATH OP VALUE)", "string", "", "a BTF field test, e.g. skb->len > 1000"),
    ]
    for f in _features():   # a checkbox per feature (a text field where it takes a value), its shorthands, settings
        title = f"{f.room[:1].upper()}{f.room[1:]} ({f.metavar or f.flag})"
        args.append((f.flag, title, "string", "", _tooltip(f.help)) if f.metavar else
                    (f.flag, title, "boolflag", "{default=false}", _tooltip(f.help)))
        args += [(s.flag, f"{s.room[:1].upper()}{s.room[1:]} ({s.flag})", "boolflag", "{default=false}",
                  _tooltip(s.help)) for s in f.shorthands]
        args += [(s.flag, f"{s.metavar} ({s.flag})", "string", "", _tooltip(s.help)) for s in f.settings]
    return "".join(f"arg {{number={i}}}{{call={call}}}{{display={display}}}{{type={kind}}}{extra}"
                   f"{{tooltip={tip}}}\n" for i, (call, display, kind, extra, tip) in enumerate(args))


def _features() -> tuple:
    """The per-packet features a flag asks for (fcap.features.FLAGGED): Wireshark's dialog offers each."""
    from fcap.features import FLAGGED
    return FLAGGED


def _tooltip(text: str) -> str:
    """A help text as an extcap value holds it (no braces, which end a value)."""
    return text.replace("{", "(").replace("}", ")")


def _validate_filter(expr: str, point: str) -> int:
    """Wireshark checks a capture filter by asking: 0 when libpcap compiles it for the point's link type."""
    if not expr.strip():
        return 0
    from fcap.kernel.filter import FilterError, compile_filter
    try:
        compile_filter(expr, _linktype(point), SNAPLEN)
    except FilterError as e:
        sys.stdout.write(f"{e}\n")
        return 1
    return 0


def capture_argv(args, point: str) -> list[str]:
    """The fcap command line of a capture Wireshark asked for (packets to stdout, the FIFO)."""
    argv = ["-i", point, "-w", "-", "-U", "-q"]
    if args.snaplen:
        argv += ["-s", args.snaplen]
    for w in args.where:
        if w.strip():
            argv += ["--where", w]
    for f in _features():
        if f.metavar:
            argv += [w for v in getattr(args, f.name) if v.strip() for w in (f.flag, v)]
        else:
            argv += [f.flag] if getattr(args, f.name) else []
        argv += [s.flag for s in f.shorthands if getattr(args, s.name)]
        argv += [w for s in f.settings for v in getattr(args, s.name) if v.strip() for w in (s.flag, v)]
    if args.extcap_capture_filter and args.extcap_capture_filter.strip():
        argv.append(args.extcap_capture_filter)
    return argv


def capture(args, point: str, fcap_main) -> int:
    if not args.fifo:
        raise UsageError("fcap extcap --capture: no --fifo")
    try:
        fd = os.open(args.fifo, os.O_WRONLY)
    except OSError as e:
        raise ExtcapError(f"{args.fifo}: {e.strerror}") from None
    os.dup2(fd, sys.stdout.fileno())
    os.close(fd)
    return fcap_main(capture_argv(args, point))


# ---- installing into Wireshark ---------------------------------------------------------------------------------

def _folders() -> dict[str, str]:
    """What the installed Wireshark's `tshark -G folders` names (name -> path)."""
    tool = shutil.which("tshark") or shutil.which("wireshark")
    if tool is None:
        raise ExtcapError("no tshark or wireshark on PATH to ask for its folders; give --dir DIR and --lua-dir DIR")
    try:
        out = subprocess.run([tool, "-G", "folders"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ExtcapError(f"{tool} -G folders: {e}") from None
    return dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in out.splitlines()) if v)


def extcap_dir(folders: dict | None = None) -> str:
    """The personal extcap folder of the installed Wireshark: `Personal Extcap path` where tshark -G folders
    names one (newer Wireshark), else the personal configuration folder's extcap/ (Wireshark 4.0 looks there)."""
    folders = _folders() if folders is None else folders
    if folders.get("Personal Extcap path"):
        return folders["Personal Extcap path"]
    if folders.get("Personal configuration"):
        return os.path.join(folders["Personal configuration"], "extcap")
    raise ExtcapError("tshark -G folders names no personal folder; give --dir DIR")


def lua_dir(folders: dict | None = None) -> str:
    """The personal Lua plugins folder of the installed Wireshark (`Personal Lua Plugins`)."""
    folders = _folders() if folders is None else folders
    if folders.get("Personal Lua Plugins"):
        return folders["Personal Lua Plugins"]
    raise ExtcapError("tshark -G folders names no personal Lua plugins folder; give --lua-dir DIR")


def _dirs(directory: str, lua: str) -> tuple[str, str]:
    folders = _folders() if not (directory and lua) else {}
    return directory or extcap_dir(folders), lua or lua_dir(folders)


def launcher_text() -> str:
    """A shell script that runs this fcap (this Python, this checkout or installation) as an extcap."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # (fcap's parent)
    return (f"#!/bin/sh\n{MARK} (fcap extcap --uninstall removes it)\n"
            f"PYTHONPATH={_sh_quote(root)}${{PYTHONPATH:+:$PYTHONPATH}} "
            f"exec {_sh_quote(sys.executable)} -m fcap extcap \"$@\"\n")


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _put(path: str, text: str, mode: int) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        raise ExtcapError(f"{path}: {e.strerror}") from None


def install(directory: str = "", lua: str = "") -> int:
    from fcap.commands import wireshark
    directory, lua = _dirs(directory, lua)
    path, plugin = os.path.join(directory, LAUNCHER), os.path.join(lua, wireshark.FILE_NAME)
    _put(path, launcher_text(), 0o755)
    _put(plugin, wireshark.dissector_text(), 0o644)
    sys.stdout.write(f"installed {path} (Wireshark lists {', '.join(_interfaces())}: tshark -D) and {plugin} "
                     f"(fields fcap.point, fcap.comm, fcap.reason ...: tshark -G fields | grep fcap)\n")
    return 0


def uninstall(directory: str = "", lua: str = "") -> int:
    from fcap.commands import wireshark
    directory, lua = _dirs(directory, lua)
    done, foreign = [], []
    for path, mark, what in ((os.path.join(directory, LAUNCHER), MARK, "launcher"),
                             (os.path.join(lua, wireshark.FILE_NAME), wireshark.MARK, "dissector")):
        ours = _ours(path, mark)
        if ours is False:
            foreign.append(f"{path} is not fcap's {what}: left in place")
        elif ours:
            try:
                os.unlink(path)
            except OSError as e:
                raise ExtcapError(f"{path}: {e.strerror}") from None
            done.append(path)
    if done or not foreign:
        sys.stdout.write(f"removed {' and '.join(done)}\n" if done else "fcap's extcap and dissector: not installed\n")
    if foreign:
        raise ExtcapError("; ".join(foreign))
    return 0


def _ours(path: str, mark: str) -> bool | None:
    """Whether the file at path is fcap's (None: there is none)."""
    try:
        with open(path) as f:
            return mark in f.read(4096)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ExtcapError(f"{path}: {e.strerror}") from None
