"""EngineClient against the real tiny engine: /generate typed results and the weight/pause endpoints."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.model import ModelConfig, init_weights, perturb_weights, save_weights
from rl360_ext.reference.engine.tokenizer import build_tokenizer
from rl360_ext.sglang.client import EngineClient, EngineError
from rl360_ext.util.procs import free_port, running

pytestmark = pytest.mark.integration


async def test_generate_and_weight_endpoints(log_dir, tmp_path) -> None:
    engine = start_engine(log_dir, "--layers", "2", "--experts", "4", "--top-k", "2", name="client-engine")
    config = ModelConfig(vocab_size=build_tokenizer().get_vocab_size(), layers=2, experts=4, top_k=2)
    weights = save_weights(tmp_path / "w.npz", config, perturb_weights(init_weights(config, 0), 0.01, 1))
    with running(engine):
        async with EngineClient(engine.url) as client:
            assert await client.health()
            prompt = list(range(10, 30))
            result = await client.generate(
                prompt, {"max_new_tokens": 5, "ignore_eos": True}, return_prompt_token_ids=True,
                return_routed_experts=True, routed_experts_start_len=7, rid="r-1", routing_key="k",
            )  # fmt: skip
            assert result.finish_reason.type == "length" and len(result.output_ids) == 5
            assert result.prompt_token_ids == prompt and result.output_logprobs.shape == (5,)
            rows = result.routing_rows(2, 2)
            assert rows.shape == (20 + 5 - 1 - 7, 2, 2) == (result.expected_routing_rows, 2, 2)
            assert rows.dtype == np.int32 and rows.min() >= 0 and rows.max() < 4

            await client.update_weight_version("v2")
            assert (await client.model_info())["weight_version"] == "v2"
            await client.update_weights_from_disk(str(weights), weight_version="v3")
            assert (await client.generate(prompt, {"max_new_tokens": 1})).weight_version == "v3"
            assert "weight_version" in await client.server_info()

            await client.pause_generation("in_place")
            held = asyncio.create_task(client.generate(prompt, {"max_new_tokens": 2, "ignore_eos": True}))
            await asyncio.sleep(0.3)
            assert not held.done()  # paused in place: the request waits
            await client.continue_generation()
            assert len((await held).output_ids) == 2

            with pytest.raises(EngineError) as bad:
                await client.update_weights_from_disk(str(tmp_path / "missing.npz"))
            assert bad.value.status == 400 and bad.value.is_client_error
            with pytest.raises(ValueError, match="pause mode"):
                await client.pause_generation("nap")
    async with EngineClient(f"http://127.0.0.1:{free_port()}") as dead:
        assert not await dead.health()
        with pytest.raises(EngineError) as refused:
            await dead.generate([1, 2, 3])
        assert refused.value.status is None
