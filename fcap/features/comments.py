"""The comment fcap writes on each pcapng packet, as one schema: its sections in the order the text has them, each
declared by the feature it belongs to (fcap.features.FEATURES: (text before, attribute, style) per key), and the one
way it is read back. parse() is read by the API (fcap.api.read), `fcap path` and the tests; Wireshark's dissector
gets the same keys (fcap.commands.wireshark) and reads them by the same rule (wireshark.lua's pairs_of)."""

from __future__ import annotations

import re

from fcap.features import FEATURES
from fcap.kernel.layout import COMMENT

# What each record's comment holds, in order: the packet's metadata (always), then each feature's keys where it has
# something to say (fcap.features.FEATURES' order)
SECTIONS = tuple(f.comment for f in FEATURES if f.comment)   # (--dump's comments are options of their own)
KEYS = tuple(key for section in SECTIONS for key in section)
STYLES = ("dec", "dec64", "hex", "hex4", "hex16", "str")   # how a value is written (fcap.kernel.layout's _STYLE)


def key_name(pre: str) -> str:
    """The key as the text writes it: ' at=' -> 'at', 'skb=0x' -> 'skb'."""
    return pre.strip().partition("=")[0]


_BY_NAME = {key_name(pre): (attr, style) for pre, attr, style in KEYS}
_KEY = re.compile(r"\s*(\w+)=")
_NEXT_KEY = re.compile(" (?:" + "|".join(map(re.escape, _BY_NAME)) + ")=")   # where a text value ends


def parse(line: str) -> dict:
    """{attribute: value} of one of fcap's comments ({} for a line that is not one: it starts with skb=0x): numbers
    as ints, text as str, the stack as its frames (() unknown). A text value runs to the next known key (comm may
    hold spaces), any other is one word; keys this version does not know are passed over."""
    if not line.startswith(COMMENT[0][0]):
        return {}
    out = _metadata(line)
    at = 0
    if out is not None:   # (the metadata in one match; the other sections after it)
        at, out = out
    else:
        out = {}
    end = len(line)
    while at < end:
        m = _KEY.match(line, at)
        if m is None:
            break
        attr, style = _BY_NAME.get(m.group(1), (None, "str"))
        if style == "str":
            nxt = _NEXT_KEY.search(line, m.end())
            stop = nxt.start() if nxt else end
        else:
            stop = line.find(" ", m.end())
            stop = end if stop < 0 else stop
        if attr is not None:
            value = _typed(style, line[m.end():stop])
            if value is not None:
                out[attr] = value
        at = stop
    if "stack" in out:
        from fcap.kernel.kstack import frames   # (the kernel's half of --stack: read packets need it only here)
        out["stack"] = frames(out["stack"])
    return out


def _section(section: tuple):
    """A whole section as fcap writes it (every key, in order), a group per value."""
    return re.compile("".join(re.escape(pre) + ("(.*?)" if style == "str" else r"(\S*)")
                              for pre, _attr, style in section) + "(?= |$)")


# The metadata section (every comment starts with all of it): one match, and each value's int() base (0: text)
_META = _section(SECTIONS[0])
_META_BASES = tuple((attr, 0 if style == "str" else 10 if style.startswith("dec") else 16)
                    for _pre, attr, style in SECTIONS[0])


def _metadata(line: str):
    """(where the metadata section ends, its {attribute: value}) in one match, as the loop in parse() reads it; None
    where it reads otherwise (a value not a number, a text value holding a known key: parse() reads it key by key)."""
    m = _META.match(line)
    if m is None:
        return None
    out = {}
    for (attr, base), text in zip(_META_BASES, m.groups()):
        if base:
            try:
                out[attr] = int(text, base)
            except ValueError:
                return None
        elif _NEXT_KEY.search(text) is not None or text[:1] == " ":
            return None
        else:
            out[attr] = text
    return m.end(), out


def of_text(comment: str | None) -> dict:
    """parse() of a packet's comments (one a line: fcap's, then --dump's): the first line that is fcap's."""
    return next((m for m in map(parse, (comment or "").split("\n")) if m), {})


def _typed(style: str, text: str):
    """A value as its style wrote it (None: the text is not one)."""
    if style == "str":
        return text
    digits = text[2:] if text.startswith("0x") else text
    try:
        return int(digits, 10 if style.startswith("dec") else 16)
    except ValueError:
        return None
