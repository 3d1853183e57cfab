"""Flag values as fcap reads them: integers and tcpdump's decimals, nonsense a UsageError naming the flag."""

from __future__ import annotations

from fcap.errors import UsageError


def int_flag(value: str | None, flag: str, default: int, lo: int = 0) -> int:
    """A flag's integer (any base Python reads: 0x.., 0o..), `default` when the flag is not given."""
    if value is None:
        return default
    try:
        n = int(value, 0)
    except ValueError:
        raise UsageError(f"invalid {flag} '{value}': not a number") from None
    if n < lo:
        raise UsageError(f"invalid {flag} '{value}': must be at least {lo}")
    return n


def decimal_flag(value: str | None, what: str, lo: int) -> int:
    """A flag's decimal integer as tcpdump's -C/-G/-W take it (0 when the flag is not given)."""
    if value is None:
        return 0
    if not (value.isascii() and value.isdigit()):
        raise UsageError(f"invalid {what} '{value}': a whole number")
    n = int(value)
    if n < lo:
        raise UsageError(f"invalid {what} '{value}': must be at least {lo}")
    return n


def print_options(args):
    """The printing flags (tcpdump's, and --dump's style) as the printer's options (fcap.text.printer)."""
    from fcap.text.printer import PrintOptions
    return PrintOptions(**{name: getattr(args, name) for name in PrintOptions._fields})
