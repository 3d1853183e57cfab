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
    from fcap.defaults import BUFFER_KIB, TRACK_MAX
    text = _parser().format_help()
    for n in (SNAPLEN, BUFFER_KIB, TRACK_MAX):
        assert f"default {n}" in text

