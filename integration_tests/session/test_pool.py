"""SessionPool on local Ray: two session-server actors, consistent hashing, concurrent collect."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import ray

from rl360_ext.reference.engine.tokenizer import default_tokenizer_dir
from rl360_ext.session.pool import SessionPool, SessionPoolError
from rl360_ext.session.samples import wire

from .conftest import session_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_pool_places_serves_collects_and_deletes(engine) -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = SessionPool(
            2, engine.url, str(default_tokenizer_dir()), r3=True, host="127.0.0.1", actor_num_cpus=0.5
        )
        try:
            miles = pool.miles_args()  # what Miles' stock generate reads to reach the pool
            assert miles["session_server_ip"] == "127.0.0.1"
            assert [f"http://127.0.0.1:{p}" for p in miles["session_server_ports"]] == pool.urls
            for port, instance_id in miles["session_server_instance_ids"].items():
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
                assert health["session_server_instance_id"] == instance_id
            # random ids: create until both servers hold one (8 at least; 8 all on one server is a
            # 1-in-128 chance on an even ring, so a fixed 8 made this test flaky)
            created = []
            while len(created) < 8 or {pool.server_for(sid) for sid, _ in created} != {0, 1}:
                assert len(created) < 64, "64 random session ids all landed on one server"
                created.append(pool.create_session(metadata={"index": len(created)}))
            for sid, base_url in created:
                assert base_url == f"{pool.urls[pool.server_for(sid)]}/sessions/{sid}/v1"
                client = session_client(base_url)
                client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=6
                )
            ids = [sid for sid, _ in reversed(created)]
            samples = pool.collect(ids)
            assert [s.session_id for s in samples] == ids
            assert [s.metadata["index"] for s in samples] == list(reversed(range(len(created))))
            for sample, (_, base_url) in zip(samples, reversed(created), strict=True):
                over_http = wire.decode(
                    httpx.get(base_url.removesuffix("/v1") + "/merged", timeout=10).content
                )
                assert np.array_equal(sample.tokens, over_http.tokens)
                assert np.array_equal(sample.routed_experts, over_http.routed_experts)
            again = asyncio.run(pool.acollect(ids[:3]))
            assert [s.session_id for s in again] == ids[:3]

            sid, base_url = pool.create_session(routing_key="shared-prefix-7")
            assert (
                httpx.get(base_url.removesuffix("/v1") + "/merged?format=json", timeout=10).json()[
                    "metadata"
                ]["session"]["routing_key"]
                == "shared-prefix-7"
            )
            forked, forked_url = pool.create_session()
            for first in ("hi", "start over"):  # a different first message: a fork, two branches
                session_client(forked_url).chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": first}], max_tokens=6
                )
            (branches,) = pool.collect_branches([forked])
            assert [b.turns[0]["segment"] for b in branches] == [0, 1]
            assert np.array_equal(branches[-1].tokens, pool.collect([forked])[0].tokens)
            # an eval attempt's session opts out of the pool's R3: no routing asked, kept or shipped
            eval_sid, eval_url = asyncio.run(pool.acreate_session(metadata={"evaluation": True}, r3=False))
            session_client(eval_url).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=6
            )
            (evaluated,) = pool.collect([eval_sid])
            assert evaluated.routed_experts is None and evaluated.metadata["session"]["r3"] is False
            assert len(evaluated.tokens) > 0
            over_http = wire.decode(httpx.get(eval_url.removesuffix("/v1") + "/merged", timeout=10).content)
            assert over_http.routed_experts is None and np.array_equal(over_http.tokens, evaluated.tokens)
            pool.delete(ids[:2])
            with pytest.raises(SessionPoolError, match=ids[0]):
                pool.collect(ids[:2])
        finally:
            pool.shutdown()
    finally:
        ray.shutdown()
