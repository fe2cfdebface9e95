"""A session's samples: the per-turn records merged into one sample per trajectory (`merge`), the
per-token policy versions (`policy_versions`), compact R3 routing rows (`routing`), the binary
wire (`wire`), the one converter to a Miles `Sample` (`miles_sample`) and Miles' samples wire
(`miles_wire`), and Miles' records view of a session (`records`). Pure functions, no I/O: the
session server (`rl360_ext.session.core`) and the generate hook call them.
"""
