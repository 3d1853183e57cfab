"""Per-packet features, each one unit (fcap.features.unit.PacketFeature), as a retis collector is: a module here
declares what a feature records and says. The lists that name features are loops over FEATURES: the command line's
flags (fcap.commands.cli), the capture Config's fields (fcap.live.planner), the API's keywords and what both refuse
(fcap.features.config), the comment's schema (fcap.features.comments) and so Wireshark's fields and extcap's
dialog, each record's comment, printed words, lines under it, further pcapng options and Packet attributes
(fcap.features.notes), whether the programs may write the records themselves (fcap.live.planner) and whether user
space lays out each block from the whole record (fcap.live.session). README's "How it is built" walks through
one."""

from __future__ import annotations

from fcap.features import (drop_reason, kernel_stack, metadata, nft_rule, packet_context, prog_verdict,
                           typed_dumps)

# in the order their parts stand in the comment and between the printed line's brackets (and under it)
FEATURES = (metadata.FEATURE, packet_context.FEATURE, drop_reason.FEATURE, nft_rule.FEATURE, prog_verdict.FEATURE,
            typed_dumps.FEATURE, kernel_stack.FEATURE)
FLAGGED = tuple(f for f in FEATURES if f.flag)   # those a flag (and an API keyword) asks for
