"""fcap's metadata as Wireshark fields: the Lua postdissector `fcap extcap --install` puts into Wireshark's personal
Lua plugins folder. Its field table is made here from the comment's own declaration (fcap.features.comments), so a
key the comment gains gets its field with the next install; the Lua (wireshark.lua beside this file) holds only how
to read the text, by the rule fcap.features.comments.parse follows."""

from __future__ import annotations

import os

from fcap.features.comments import KEYS, STYLES, key_name

MARK = "fcap Wireshark dissector"          # the line uninstall looks for before removing a file
FILE_NAME = "fcap.lua"


def comment_fields() -> list[tuple[str, str, str]]:
    """(key as the text writes it, field name, style) for every key of the comment, in its order: `skb=0x...`
    is ("skb", "skb", "hex16"), a drop's `at=` is ("at", "location", "str") (the field: fcap.location)."""
    out = []
    for pre, attr, style in KEYS:   # (each style one of wireshark.lua's MAKE)
        if style not in STYLES:
            raise ValueError(f"comment key {pre!r}: style {style!r} has no Wireshark field type")
        out.append((key_name(pre), attr, style))
    return out


def field_names() -> list[str]:
    """Every fcap.* field the dissector registers (the comment's keys, the point, the dumps')."""
    fixed = ["point", "hook", "other", "dump", "dump.path", "dump.type", "dump.addr", "dump.value", "dump.error",
             "dump.member"]
    return ["fcap." + n for n in fixed + [f for _k, f, _s in comment_fields()]]


def dissector_text() -> str:
    """The Lua plugin's text: the template with the field table filled in."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "wireshark.lua")) as f:
        template = f.read()
    keys = "\n".join(f'    {{"{key}", "{name}", "{style}"}},' for key, name, style in comment_fields())
    return template.replace("@KEYS@", keys).replace("@MARK@", MARK)
