"""fcap --help and man fcap: they name every subcommand and every point spelling the code knows, the checked-in page
is what the parser generates now, and it renders without a warning."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fcap.commands.cli import COMMANDS, SUBCOMMANDS, _parser
from fcap.commands.manpage import manpage
from fcap.points import kinds
from fcap.points.semantic import TABLE

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "man" / "fcap.1"


@pytest.fixture(scope="module")
def help_text() -> str:
    """What `fcap --help` prints, from the command itself."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "fcap.commands.cli", "--help"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_checked_in_page_is_the_parsers():
    assert PAGE.read_text() == manpage(_parser(), COMMANDS), \
        "man/fcap.1 differs from the parser's: regenerate it with python -m fcap.commands.manpage > man/fcap.1"


def test_help_names_every_subcommand(help_text):
    assert {c.name for c in COMMANDS} | {"list"} == set(SUBCOMMANDS)   # (list: list-devices' short name)
    for name in SUBCOMMANDS:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", help_text), name   # (list alone, too)
    for c in COMMANDS:
        assert re.search(rf"^  {re.escape(c.name)} .*\n +{re.escape(c.summary)}$", help_text, re.M), c.name


def test_help_names_every_point_spelling(help_text):
    for k in kinds.ALL:
        assert re.search(rf"^  {k.name}/{k.operand} +{re.escape(k.summary)}$", help_text, re.M), k.name
    for name, (meaning, _hooks) in TABLE.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(meaning)}$", help_text, re.M), name
    for spelling in ("tp/SUBSYS/TP", "POINT:ARG", "KIND/GLOB", "fentry/ip_*", "-i again"):
        assert spelling in help_text, spelling


def test_page_has_the_sections():
    page = PAGE.read_text()
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "CAPTURE POINTS", "SEMANTIC POINTS", "SUBCOMMANDS",
                    "EXAMPLES", "SEE ALSO"):
        assert f"\n.SH {section}\n" in page, section
    assert "tcpdump(8)" in page and "pcap\\-filter(7)" in page
    for a in _parser()._actions:
        for flag in a.option_strings:
            assert f"\\fB{flag.replace('-', chr(92) + '-')}\\fR" in page, flag


def _render() -> subprocess.CompletedProcess:
    """The page rendered as man would show it, warnings on: man -l where man-db is, else groff's man macros."""
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8", MANPAGER="cat", PAGER="cat")
    if shutil.which("man"):
        argv = ["man", "--warnings", "-l", str(PAGE)]
    elif shutil.which("groff"):
        argv = ["groff", "-man", "-Tutf8", "-ww", str(PAGE)]
    else:
        pytest.skip("neither man nor groff here")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_page_renders_without_warnings():
    r = _render()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = re.sub(r".\x08", "", r.stdout)   # (bold and underline by overstrike, where man still does it)
    for c in COMMANDS:
        assert f"fcap {c.name}" in text
    for k in kinds.ALL:
        assert f"{k.name}/" in text
    assert all(name in text for name in TABLE)


def test_pip_installs_the_page():
    """pyproject.toml gives the page to setuptools' data-files for PREFIX/share/man/man1 (where man finds it)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.data-files]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^"share/man/man1" = \["man/fcap.1"\]$', section, re.M), section
