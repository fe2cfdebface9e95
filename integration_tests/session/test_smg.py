"""The real SMG gateway in the path: session server -> smg (policy manual) -> two tiny engines."""

from __future__ import annotations

import pytest

from rl360_ext.local.services import start_engine, start_smg
from rl360_ext.util.procs import running

from .conftest import END_OF_TURN_BIAS, merged, new_session, session_client, start_session_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_sticky_routing_and_delta_r3_through_smg(log_dir) -> None:
    engines = [start_engine(log_dir, name=f"smg-engine-{i}") for i in range(2)]
    gateway = start_smg([e.url for e in engines], log_dir, policy="manual")
    server = start_session_server(log_dir, gateway.url, "--r3", name="smg-session")
    with running(*engines, gateway, server):
        sessions = [new_session(server) for _ in range(4)]
        for index, (_, base_url) in enumerate(sessions):
            client = session_client(base_url)
            messages = [{"role": "user", "content": f"Fix bug number {index} in the parser."}]
            for turn in range(3):
                reply = client.chat.completions.create(
                    model="policy", messages=messages, max_tokens=32, seed=turn, logit_bias=END_OF_TURN_BIAS
                )
                messages += [
                    reply.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "ok"},
                ]
        workers = set()
        for session_id, _ in sessions:
            sample = merged(server, session_id)
            turns = sample.turns
            routed = {t["routed_worker"] for t in turns}
            assert len(routed) == 1 and None not in routed  # X-SMG-Routing-Key kept the session on one engine
            workers |= routed
            assert all(t["cached_tokens"] > 0 for t in turns[1:])  # ... so its prefix stayed cached
            assert len(sample.routed_experts) == len(sample.tokens) - 1  # R3 fields survive the gateway
            starts = [t["input_start"] for t in turns]
            assert [t["routing_rows"] for t in turns] == [
                b - a + (0 if i else -1)
                for i, (a, b) in enumerate(zip(starts, [*starts[1:], len(sample.tokens)], strict=True))
            ]
        assert workers <= {e.url for e in engines}
