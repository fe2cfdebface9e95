"""Policy-version vocabulary shared by the producer (session) and the consumers (train, rollout).

Owns the per-token version conventions every layer above reads: SGLang's `weight_version` is a
string label; rl360 numbers versions as integers (the demo pushes "0", "1", ...), so a label that
is a decimal integer is its number and anything else is unnumbered. Per-token arrays use
`UNVERSIONED` (-1) for tokens no forward of a known version produced (prompt and tool tokens in
`token_version`). The merged sample's version arrays travel in a Miles `Sample`'s metadata under
`VERSIONS_KEY`; `TURN_OUTPUT_START` and `TURN_CACHED_TOKENS` name its per-turn position facts.
`RoutingSource` names which forward recorded an R3 row: the one vocabulary of row provenance, from
the session's per-turn rows (`rl360_ext.session.samples.routing.row_sources`) through the merged sample
and its wire to the trainer's metrics.
"""

from __future__ import annotations

from enum import IntEnum

VERSIONS_KEY = "rl360_versions"  # Sample.metadata key of the per-token version arrays
UNVERSIONED = -1  # a token no numbered forward produced (prompt / tool tokens, unnumbered labels)
# Per kept turn (like `turn_first_version`): the full-sequence index of the turn's first output
# token (input_start + input_tokens, non-decreasing), and SGLang's `cached_tokens` of the turn's
# first forward (the prompt tokens it read from the prefix cache).
TURN_OUTPUT_START = "turn_output_start"
TURN_CACHED_TOKENS = "turn_cached_tokens"


class RoutingSource(IntEnum):
    """The forward that recorded an R3 routing row."""

    DECODE = 0  # the decode step that fed a sampled token: the routing the sampler used
    PREFILL = 1  # the prefill of an input token (first prompt, tool output, template tokens)
    REPREFILL = 2  # a sampled token whose row a later prefill recorded (next turn / retract re-prefill)


def version_number(label: str | None) -> int:
    """The integer version of a weight-version label, or UNVERSIONED when it is not a decimal integer."""
    if label is None:
        return UNVERSIONED
    text = label.strip()
    return int(text) if text.isdecimal() else UNVERSIONED
