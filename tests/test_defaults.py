"""fcap.defaults: the snap length's one check, and the defaults the command line shows are the ones it uses."""

import pytest

from fcap.defaults import SNAPLEN, SNAPLEN_LIMIT, check_snaplen
from fcap.errors import UsageError


def test_check_snaplen_range():
    assert check_snaplen(1) == 1 and check_snaplen(SNAPLEN) == SNAPLEN and check_snaplen(SNAPLEN_LIMIT)
    with pytest.raises(UsageError, match="invalid snaplen '0': must be at least 1"):
        check_snaplen(0)
    with pytest.raises(UsageError, match="invalid snaplen '9e9': too large"):
        check_snaplen(SNAPLEN_LIMIT + 1, "9e9")


def test_help_shows_the_defaults():
    from fcap.commands.cli import _parser
    from fcap.defaults import BUFFER_KIB_MAX, BUFFER_KIB_PER_CPU, TRACK_MAX
    text = " ".join(_parser().format_help().split())
    for n in (SNAPLEN, TRACK_MAX):
        assert f"default {n}" in text
    assert f"default {BUFFER_KIB_PER_CPU} per CPU, at most {BUFFER_KIB_MAX} in all" in text


def test_buffer_default_fits_the_machine():
    """-B's default: 2 MiB a CPU on a laptop and a 16-CPU server, 128 MiB in all and at least 1 MiB a CPU past
    that; twice that for pcapng (its blocks are ~2.5 times a pcap record)."""
    from fcap.defaults import buffer_kib
    assert [buffer_kib(n) for n in (1, 2, 16, 64, 128, 256)] == [2048, 4096, 32768, 131072, 131072, 262144]
    assert [buffer_kib(n, pcapng=True) for n in (1, 2, 16, 256)] == [4096, 8192, 65536, 524288]

