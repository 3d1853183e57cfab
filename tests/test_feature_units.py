"""Per-packet features as units (fcap.features): each declares its flag and API keyword, what it refuses, its
comment keys and its user-space half; the command line, the API, the comment's schema, the Packet and --json, and
the file-ring decision read them from FEATURES, so what a unit declares is what the capture does. The live tests of
each feature (test_context, test_stack, test_nft, test_drop*) read its output back from real captures."""

from __future__ import annotations

import os
from dataclasses import fields

import pytest

import fcap
from fcap.errors import UsageError
from fcap.features import FEATURES, FLAGGED, comments
from fcap.features.config import asked, in_comment, refusal
from fcap.kernel import program as cprog
from fcap.kernel.progopts import ProgramOptions
from fcap.live.planner import Config
from fcap.text.jsonout import packet_object
from fcap.packet import Packet

PACKET = {f.name for f in fields(Packet)}


def test_the_units_declare_the_comment_in_its_order():
    names = [f.name for f in FEATURES]
    assert len(names) == len(set(names)) and names[0] == "metadata"
    assert comments.SECTIONS == tuple(f.comment for f in FEATURES if f.comment)   # (those with keys)
    keys = [comments.key_name(pre) for pre, _a, _s in comments.KEYS]
    assert len(keys) == len(set(keys)), "a key two units write"


def test_a_units_keys_are_packet_attributes_and_json_keys():
    """Every attribute a unit's comment keys name is a Packet attribute (read back by fcap.read) and, known, a
    --json key; those that are not are the record's own (protocol, pkt_type, len) or named otherwise (verdict_name)."""
    otherwise = {"protocol", "pkt_type", "len", "verdict_name"}
    attrs = {attr for _pre, attr, _s in comments.KEYS}
    assert attrs - PACKET == otherwise
    p = Packet(ts_ns=1, point="p", data=b"", orig_len=0, linktype=101,
               **{a: ("f+0x1",) if a == "stack" else 1 if a == "skb" else "x" for a in attrs & PACKET})
    assert attrs & PACKET <= set(packet_object(p))


def test_the_units_name_their_kernel_halves_without_importing_them():
    """Each unit's program parts are parts the builder runs, by name; the kernel's own messages name --dump's and
    --ct's flag as the unit declares them; and printing a file imports no module of the kernel's halves, nor the
    API's Packet and the dataclass machinery (the command line reads every unit: those imports were most of `fcap
    -r`'s start-up)."""
    import subprocess
    import sys
    from fcap.features import typed_dumps
    from fcap.kernel import dumps
    names = {p.name for p in cprog.PARTS}
    assert all(set(f.program) <= names for f in FEATURES) and any(f.program for f in FEATURES)
    assert typed_dumps.FEATURE.flag == dumps.FLAG and typed_dumps.FEATURE.shorthands[0].value == dumps.CT_PATH
    probe = ("import sys\nfrom fcap.commands.cli import main\nmain(['-r', sys.argv[1], '-nn'])\n"
             "print('MODULES', *(m for m in sys.modules if m.startswith(('bpf', 'fcap.kernel.', 'fcap.host.', "
             "'fcap.points', 'fcap.packet', 'dataclasses'))))")
    path = os.path.join(os.path.dirname(__file__), "..", "pcaps")
    pcap = next(os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".pcap"))
    out = subprocess.run([sys.executable, "-c", probe, pcap], capture_output=True, text=True, check=True).stdout
    loaded = out.splitlines()[-1].split()[1:]
    assert out.splitlines()[-1].startswith("MODULES") and "IP " in out
    assert set(loaded) <= {"fcap.kernel.layout", "fcap.kernel.record"}, loaded


def test_each_flag_is_a_config_field_an_option_and_an_api_keyword():
    for f in FLAGGED:
        assert f.flag.startswith("--") and f.help and f.name in Config._fields, f.name
        assert (f.name in ProgramOptions._fields) == f.option, f.name
        assert f.room or f.annotator is None, f"{f.name}: says something in the comment, so refuses pcap"
    for f in FLAGGED:
        for setting in f.settings:
            assert setting.flag.startswith("--") and setting.name in Config._fields, setting
    cfg = Config(points=["p"], **asked({"stack": 1, "nft": 0}.get))
    assert cfg.stack is True and cfg.nft is False and cfg.context is False and cfg.nft_netns == ()
    with_ns = Config(points=["p"], **asked({"nft_netns": "x"}.get))
    assert with_ns.nft_netns == ("x",) and refusal(with_ns, []) == "--nft-netns says where --nft looks: give --nft too"
    assert in_comment(cfg) == ["--stack"] and in_comment(cfg._replace(stack=False)) == []
    assert refusal(cfg, [], "pcap") == "--stack: a pcap file has no room for the stack; write pcapng (-w FILE.pcapng)"
    assert refusal(cfg, [], "pcapng") == "" and refusal(cfg, [], None) == ""


@pytest.mark.parametrize("feature", [f for f in FLAGGED], ids=lambda f: f.name)
def test_the_command_line_has_each_flag(feature):
    from fcap.commands.cli import _parser
    more = [w for s in feature.settings for w in (s.flag, "a", s.flag, "b")] + [s.flag for s in feature.shorthands]
    asked = [feature.flag, "x", feature.flag, "y"] if feature.metavar else [feature.flag]
    args = _parser().parse_args(["-i", "tp_btf/net_dev_queue", *asked, *more])
    assert getattr(args, feature.name) == (["x", "y"] if feature.metavar else True)
    assert all(getattr(args, s.name) == ["a", "b"] for s in feature.settings)
    assert all(getattr(args, s.name) is True for s in feature.shorthands)
    assert getattr(_parser().parse_args(["-i", "tp_btf/net_dev_queue"]), feature.name) == \
        ([] if feature.metavar else False)


def test_a_shorthand_is_one_value_of_its_feature():
    """--ct is the dump of the conntrack entry: alone, with --dump ct (once), and after other --dump paths; the API's
    ct=True the same; a flag's error line names the flag the user gave."""
    from fcap.features.config import asked, in_comment
    from fcap.features.typed_dumps import FEATURE
    from fcap.live.session import Config

    def dump(**said) -> tuple:
        return asked(said.get)["dump"]
    assert dump(ct=True) == ("ct",) and dump(dump=["ct"], ct=True) == ("ct",)
    assert dump(dump=["skb->dev", "skb->len"], ct=True) == ("skb->dev", "skb->len", "ct")
    assert dump(dump="skb->dev") == ("skb->dev",) and dump() == ()
    with pytest.raises(fcap.FcapError, match="dump: strings"):
        dump(dump=[1])
    assert in_comment(Config(points=["x"], dump=("ct",))) == ["--ct"]
    assert FEATURE.flag_of(Config(points=["x"], dump=("ct", "skb->dev"))) == "--dump"


def test_the_api_takes_the_units_keywords_and_refuses_as_the_command_line():
    """An unknown keyword is Python's TypeError; --nft's refusal (no drop point) is the API's too, before anything
    is loaded."""
    with pytest.raises(TypeError, match="'stacks'"):
        fcap.capture("tp_btf/net_dev_queue", stacks=True)
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        pytest.skip("this kernel has no BTF")
    with pytest.raises(UsageError, match="^--nft names the nftables rule .*capture at a drop point"):
        fcap.capture("tp_btf/net_dev_queue", nft=True)
