"""The tiny engine against Miles' Megatron fork on CPU, float64: forward, routing replay, gradient.

One real merged sample (a tool-using conversation through a real session server with --r3 and a
real float64 tiny engine, as integration_tests/reference/trainer/ builds it) is recomputed by a Megatron
`GPTModel` holding the engine's weights (mapping.py):

- forward: Megatron's log-probs of the sampled tokens equal the engine's float64 ones to 1e-9
  inside `float64_islands` (precision.py); stock Megatron's float32 RoPE and router softmax are
  measured beside it;
- routing: Megatron's own top-k per (token, layer) against the sample's `rollout_routed_experts`
  (measured), then with Miles' replay (`fill_replay_data` + `register_replay_list_moe` +
  `routing_replay_manager`, the `--use-rollout-routing-replay` path): agreement 1.0;
- gradient: Miles' own `loss_function` -> `policy_loss_function` on Megatron's logits, with
  rl360's TIS and pg-loss reducer loaded by Miles from `--custom-tis-function-path` /
  `--custom-pg-loss-reducer-function-path`, back-propagated by autograd, against the reference
  trainer's hand-written gradient on the same sample: per-parameter relative error <= 1e-6, with
  Miles' `--true-on-policy-mode` log-prob path (it keeps float64 logits; the default path asserts
  float32/bf16 logits and is measured beside it). Miles' PPO ratio is float32 whatever the input
  (`math_utils._safe_clamp_log_ratio` casts the log-ratio with `.float()`), so the float64 gradient
  agrees to float32 rounding of the per-token weight (~4e-8), not to 1e-15; with and without TIS.

Every figure is printed (`-s` shows them) and written to `megatron_parity.json` in tmp_path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from integration_tests.megatron.mapping import build_gpt_model, from_megatron, load_into
from integration_tests.megatron.parity import (
    MergedCase,
    agreement,
    fill_replay,
    forward_logits,
    miles_batch,
    miles_loss_args,
    miles_loss_backward,
    reference_gradient,
    relative_errors,
    replayed,
    response_logprobs,
    routing_of,
)
from integration_tests.megatron.precision import float64_islands
from integration_tests.reference.trainer.test_trainer_session import _conversation, _engine_logprobs
from integration_tests.session.conftest import merged, new_session, start_session_server
from rl360_ext.local.services import start_engine
from rl360_ext.reference.engine.model import ModelConfig, TinyMoEModel, init_weights
from rl360_ext.reference.engine.tokenizer import build_tokenizer
from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig
from rl360_ext.rollout.sample import Sample
from rl360_ext.rollout.sample_fill import fill_from_merged
from rl360_ext.util.procs import running

SEED = 5
FORWARD_TOL = 1e-9
GRADIENT_TOL = 1e-6
STOCK_FORWARD_BOUND = 1e-5  # float32 RoPE / router softmax: measured ~1e-6, bounded here
FLOAT32_ROUNDING = 2.0**-23
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> MergedCase:
    log_dir = tmp_path_factory.mktemp("megatron-logs")
    engine = start_engine(log_dir, "--seed", str(SEED), name="megatron-engine")
    server = start_session_server(log_dir, engine.url, "--r3", name="megatron-session")
    with running(engine, server):
        session_id, base_url = new_session(server)
        _conversation(base_url)
        wire = merged(server, session_id)
        engine_logprobs = _engine_logprobs(engine.url, wire.tokens.astype(int).tolist())
    tokenizer = build_tokenizer()
    sample = Sample(group_index=0, index=0)
    filled, why = fill_from_merged(sample, wire, tokenizer.decode)
    assert filled and why is None
    mask = np.asarray(sample.loss_mask)
    assert len(np.flatnonzero(np.diff(mask))) >= 2, "sampled spans around a masked tool-output span"
    config = ModelConfig(vocab_size=tokenizer.get_vocab_size())
    return MergedCase(sample, engine_logprobs, config, init_weights(config, SEED))


@pytest.fixture(scope="module")
def gpt(megatron_world: list[str], case: MergedCase) -> Any:
    """The Megatron model with the engine's seed weights; its routers registered with Miles' replay."""
    import torch
    from miles.utils.replay_base import routing_replay_manager

    routing_replay_manager.enabled = True  # Miles' actor sets it from --use-routing-replay before building
    routing_replay_manager.stage = "fallthrough"
    model = build_gpt_model(case.config, torch.float64)
    load_into(model, case.weights, case.config)
    assert len(routing_replay_manager.replays) >= case.config.layers
    yield model
    routing_replay_manager.clear_all()
    routing_replay_manager.enabled = False


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield FIGURES
    out = Path(tmp_path_factory.getbasetemp()) / "megatron_parity.json"
    out.write_text(json.dumps(FIGURES, indent=2, sort_keys=True))
    print(f"\nmegatron parity figures ({out}):\n{json.dumps(FIGURES, indent=2, sort_keys=True)}")


def test_forward_matches_the_engine(gpt: Any, case: MergedCase, figures: dict[str, float]) -> None:
    expected = case.engine_logprobs[case.prompt :]
    sampled = case.sampled
    stock = np.abs(response_logprobs(gpt, case) - expected)[sampled]
    with float64_islands(gpt, case.config.rope_theta):
        lifted_logprobs = response_logprobs(gpt, case)
    lifted = np.abs(lifted_logprobs - expected)[sampled]
    with float64_islands(gpt, case.config.rope_theta, rope=False):
        rope_only = np.abs(response_logprobs(gpt, case) - expected)[sampled]
    with float64_islands(gpt, case.config.rope_theta, router=False):
        router_only = np.abs(response_logprobs(gpt, case) - expected)[sampled]
    recorded = np.asarray(case.sample.rollout_log_probs)
    figures.update(
        forward_sampled_tokens=float(sampled.sum()),
        forward_stock_max=float(stock.max()),
        forward_stock_mean=float(stock.mean()),
        forward_float64_max=float(lifted.max()),
        forward_float64_mean=float(lifted.mean()),
        forward_float32_rope_only_max=float(rope_only.max()),
        forward_float32_router_softmax_only_max=float(router_only.max()),
    )
    assert lifted.max() <= FORWARD_TOL
    assert stock.max() <= STOCK_FORWARD_BOUND
    bound = FLOAT32_ROUNDING * np.abs(recorded) + 1e-12  # the session stores log-probs as float32
    assert (np.abs(lifted_logprobs - recorded) <= bound)[sampled].all()


def test_routing_with_and_without_miles_replay(gpt: Any, case: MergedCase, figures: dict[str, float]) -> None:
    from miles.utils.replay_base import routing_replay_manager

    recorded = np.asarray(case.sample.rollout_routed_experts)
    assert recorded.shape == (len(case.sample.tokens) - 1, case.config.layers, case.config.top_k)
    routing_replay_manager.stage = "fallthrough"
    own_stock = agreement(routing_of(gpt, case), recorded)
    with float64_islands(gpt, case.config.rope_theta):
        own_float64 = agreement(routing_of(gpt, case), recorded)
    # rows the router would not pick (each expert id shifted by one): replay must follow them
    shifted = ((recorded + 1) % case.config.experts).astype(recorded.dtype)
    routing_replay_manager.stage = "replay_forward"
    try:
        fill_replay(gpt, case, shifted)
        forced_map = routing_of(gpt, case)
        forced, forced_vs_recorded = agreement(forced_map, shifted), agreement(forced_map, recorded)
        fill_replay(gpt, case, recorded)
        replayed = agreement(routing_of(gpt, case), recorded)
        routing_replay_manager.clear_all_forward()
        replayed_logprobs = response_logprobs(gpt, case)
    finally:
        routing_replay_manager.stage = "fallthrough"
        routing_replay_manager.clear_all()
    gap = np.abs(replayed_logprobs - case.engine_logprobs[case.prompt :])[case.sampled]
    figures.update(
        routing_rows=float(recorded.shape[0] * recorded.shape[1]),
        routing_agreement_without_replay_stock=own_stock,
        routing_agreement_without_replay_float64=own_float64,
        routing_agreement_with_replay=replayed,
        routing_agreement_with_shifted_replay=forced,
        routing_agreement_shifted_replay_vs_recorded=forced_vs_recorded,
        forward_stock_with_replay_max=float(gap.max()),
    )
    assert replayed == 1.0
    assert forced == 1.0 and forced_vs_recorded == 0.0
    assert gap.max() <= STOCK_FORWARD_BOUND


@pytest.mark.parametrize("use_tis", [True, False], ids=["tis", "no-tis"])
def test_gradient_through_miles_policy_loss(
    gpt: Any, case: MergedCase, figures: dict[str, float], use_tis: bool
) -> None:
    import torch

    from integration_tests.megatron.mapping import megatron_tensors

    # r3, rl360's TIS function and pg-loss reducer (TrainerConfig's defaults), the recipe's clip range
    config = TrainerConfig(unversioned_as=0, eps_clip_high=0.28, use_tis=use_tis)
    assert config.tis_function_path and config.pg_loss_reducer_path and config.r3
    reference = reference_gradient(case, config)
    args = miles_loss_args(Trainer(case.config, case.weights, config))

    rows = np.asarray(case.sample.rollout_routed_experts)
    with float64_islands(gpt, case.config.rope_theta):
        old_log_probs = torch.from_numpy(
            replayed(gpt, case, rows, "replay_forward", response_logprobs).copy()
        )
        batch = miles_batch(case, old_log_probs)
        grads = {}
        losses = {}
        for path, true_on_policy, cast in (
            ("float64", True, torch.float64),
            ("float32", False, torch.float32),
        ):
            gpt.zero_grad(set_to_none=True)
            logits = replayed(
                gpt, case, rows, "replay_backward", lambda m, c: forward_logits(m, c.sample.tokens)
            )
            losses[path] = miles_loss_backward(args, batch, logits.to(cast), true_on_policy=true_on_policy)
            grads[path] = from_megatron(megatron_tensors(gpt, grads=True), case.config)
    float64_grads, float32_grads = grads["float64"], grads["float32"]
    float64_loss, float32_loss = losses["float64"], losses["float32"]
    errors = relative_errors(float64_grads, reference)
    float32_errors = relative_errors(float32_grads, reference)
    worst = max(errors, key=errors.__getitem__)
    tag = "tis" if use_tis else "no_tis"
    figures.update(
        {
            f"gradient_{tag}_parameters": float(len(errors)),
            f"gradient_{tag}_max_relative_error": errors[worst],
            f"gradient_{tag}_median_relative_error": float(np.median(list(errors.values()))),
            f"gradient_{tag}_float32_loss_path_max_relative_error": max(float32_errors.values()),
            f"gradient_{tag}_reference_norm": float(np.sqrt(sum(np.sum(v * v) for v in reference.values()))),
            f"miles_loss_{tag}_float64": float64_loss,
            f"miles_loss_{tag}_float32_path": float32_loss,
        }
    )
    print(f"worst gradient: {worst} {errors[worst]:.3e}")
    assert all(np.linalg.norm(value) > 0 for value in reference.values())
    assert errors[worst] <= GRADIENT_TOL


def _rollout(log_dir: Path, engine_url: str, name: str) -> tuple[Sample, np.ndarray]:
    """A merged sample of one tool-using conversation on `engine_url`, and its float64 engine log-probs."""
    server = start_session_server(log_dir, engine_url, "--r3", name=name)
    with running(server):
        session_id, base_url = new_session(server)
        _conversation(base_url)
        wire = merged(server, session_id)
    engine_logprobs = _engine_logprobs(engine_url, wire.tokens.astype(int).tolist())
    sample = Sample(group_index=0, index=0)
    filled, why = fill_from_merged(sample, wire, build_tokenizer().decode)
    assert filled and why is None
    return sample, engine_logprobs


@pytest.mark.slow
def test_round_trip_megatron_step_push_and_next_rollout(
    gpt: Any, case: MergedCase, figures: dict[str, float], tmp_path: Path
) -> None:
    """One optimizer step on the Megatron model, its weights in the engine's `.npz` format pushed
    through SMG (`update_weights_from_disk`), and the next rollout's log-probs against Megatron's
    recompute. The step is torch's AdamW over the GPTModel's parameters (Megatron's own
    DistributedOptimizer needs its DDP wrapper, not built here). The module's model is stepped
    and given the seed weights back at the end (Miles' replay streams are bound to its routers)."""
    try:
        _round_trip(gpt, case, figures, tmp_path)
    finally:
        gpt.zero_grad(set_to_none=True)
        load_into(gpt, case.weights, case.config)


def _round_trip(model: Any, case: MergedCase, figures: dict[str, float], tmp_path: Path) -> None:
    import torch

    from integration_tests.megatron.mapping import megatron_tensors
    from rl360_ext.local.services import start_smg
    from rl360_ext.reference.engine.model import save_weights
    from rl360_ext.weights.push import push_weights_from_disk

    config = TrainerConfig(unversioned_as=0, eps_clip_high=0.28)
    args = miles_loss_args(Trainer(case.config, case.weights, config))
    rows = np.asarray(case.sample.rollout_routed_experts)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    with float64_islands(model, case.config.rope_theta):
        old = torch.from_numpy(replayed(model, case, rows, "replay_forward", response_logprobs).copy())
        logits = replayed(
            model, case, rows, "replay_backward", lambda m, c: forward_logits(m, c.sample.tokens)
        )
        miles_loss_backward(args, miles_batch(case, old), logits, true_on_policy=True)
    optimizer.step()
    stepped = from_megatron(megatron_tensors(model), case.config)
    moved = max(float(np.abs(stepped[name] - case.weights[name]).max()) for name in case.weights)
    path = save_weights(tmp_path / "megatron-step-1.npz", case.config, stepped)

    log_dir = tmp_path / "logs"
    engine = start_engine(log_dir, "--seed", str(SEED), name="megatron-roundtrip-engine")
    with running(engine):
        gateway = start_smg([engine.url], log_dir, extra=["--enable-rl"], name="megatron-roundtrip-smg")
        with running(gateway):
            push = push_weights_from_disk(gateway.url, str(path), "1")
            assert push.complete, push.to_dict()
        sample, engine_logprobs = _rollout(log_dir, engine.url, "megatron-roundtrip-session")
    after = MergedCase(sample, engine_logprobs, case.config, stepped)
    sampled = after.sampled
    with float64_islands(model, case.config.rope_theta):
        recomputed = response_logprobs(model, after)
    under_seed = TinyMoEModel(case.config, case.weights).sequence_logprobs(sample.tokens)[after.prompt - 1 :]
    expected = engine_logprobs[after.prompt :]
    gap = np.abs(recomputed - expected)[sampled]
    recorded = np.asarray(sample.rollout_log_probs)
    figures.update(
        roundtrip_weight_max_change=moved,
        roundtrip_sampled_tokens=float(sampled.sum()),
        roundtrip_forward_float64_max=float(gap.max()),
        roundtrip_seed_weights_max_diff=float(np.abs(under_seed - expected)[sampled].max()),
    )
    assert moved > 1e-4
    assert gap.max() <= FORWARD_TOL
    assert np.abs(under_seed - expected)[sampled].max() > 1e3 * FORWARD_TOL, "the push changed nothing"
    bound = FLOAT32_ROUNDING * np.abs(recorded) + 1e-12
    assert (np.abs(recomputed - recorded) <= bound)[sampled].all()


def test_forward_backward_throughput(gpt: Any, case: MergedCase, figures: dict[str, float]) -> None:
    """Forward + backward tokens/s of the merged sample: Megatron-on-CPU (float64, stock, own routing)
    beside the reference trainer (float64 numpy, R3), best of 3 each, on this shared machine."""
    import torch

    from rl360_ext.reference.trainer.backward import TrainModel

    tokens = np.asarray(case.sample.tokens)
    prompt = case.prompt
    response = len(tokens) - prompt
    dlogprobs = np.random.default_rng(0).standard_normal(response)

    def megatron_step() -> None:
        gpt.zero_grad(set_to_none=True)
        logits = forward_logits(gpt, case.sample.tokens)[0, prompt - 1 : -1]
        picked = torch.log_softmax(logits, dim=-1).gather(1, torch.from_numpy(tokens[prompt:])[:, None])[:, 0]
        (picked * torch.from_numpy(dlogprobs)).sum().backward()

    reference = TrainModel(case.config, case.weights)

    def reference_step() -> None:
        _, tape = reference.forward(tokens, prompt, np.asarray(case.sample.rollout_routed_experts))
        reference.backward(tape, dlogprobs)

    def best_of_3(step: Any) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        return min(times)

    try:
        megatron_s, reference_s = best_of_3(megatron_step), best_of_3(reference_step)
    finally:
        gpt.zero_grad(set_to_none=True)
    figures.update(
        throughput_tokens=float(len(tokens)),
        throughput_megatron_tokens_per_s=len(tokens) / megatron_s,
        throughput_reference_tokens_per_s=len(tokens) / reference_s,
    )
    assert megatron_s > 0 and reference_s > 0
