"""The Megatron half of `rl360 bench trainer --megatron`, run in the scratch venv; writes JSON.

    MILES_SRC=... MEGATRON_SRC=... /tmp/miles-venv/bin/python -m integration_tests.megatron.bench --out F

Owns the measurement, not its presentation (rl360_ext/local/bench/megatron.py reads the JSON and
prints the rows beside the reference trainer's). On the conversation `rl360 bench trainer` itself
uses (rl360_ext.local.bench.trainer.conversation: a float64 tiny engine, seed 0, the last turn's
routing covering every position), a Megatron `GPTModel` from Miles' fork holding the engine's
weights (mapping.py) gives:

- forward: |Δ log p| mean and max of the sampled tokens against the engine's, and the routing
  agreement (Megatron's chosen experts vs the recorded top-k), without replay (own top-k) and with
  Miles' replay (`fill_replay_data`, `routing_replay_manager` at `replay_forward`), both with
  Megatron's float32 islands as they are ("stock") and lifted to float64 (precision.py);
- gradient: one step of Miles' `loss_function` on Megatron's logits (rl360's TIS and reducer,
  R3, `--true-on-policy-mode`) against the reference trainer's gradient on the same sample: the
  per-parameter relative error (max, median);
- throughput: forward+backward tokens/s at the demo size (DEMO_SAMPLES random sequences of
  DEMO_SAMPLE_TOKENS, the last three quarters scored, own routing, float64 parameters, stock
  islands: how Megatron runs), after one untimed warm-up step (torch's first call sets up its
  thread pool and allocator).

Exit status 2 with one line on stderr when Megatron, Miles or torch does not import here (the
bench turns it into its missing-prerequisite line); the figures are asserted by the tests, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

EXIT_UNAVAILABLE = 2
SCHEMA = 1


def _say(line: str) -> None:
    print(f"integration_tests.megatron.bench: {line}", file=sys.stderr, flush=True)


def _import_problem() -> str | None:
    """Why Megatron, Miles or torch does not import under this interpreter, or None."""
    sources = {name: os.environ.get(name) for name in ("MILES_SRC", "MEGATRON_SRC")}
    unset = [name for name, value in sources.items() if not value]
    if unset:
        return f"{' and '.join(unset)} not set"
    for value in (sources["MEGATRON_SRC"], sources["MILES_SRC"]):
        src = str(Path(str(value)).expanduser().resolve())
        if src not in sys.path:
            sys.path.insert(0, src)
    try:
        import megatron.core.models.gpt.gpt_model  # noqa: F401
        import miles.utils.replay_base  # noqa: F401
        import torch  # noqa: F401
    except ImportError as error:
        return (
            f"Megatron or Miles does not import in {sys.executable}: {type(error).__name__}: {error} "
            "(build the venv with integration_tests/miles/setup_venv.sh)"
        )
    return None


def _commit(src: str | None) -> str:
    if not src:
        return "?"
    try:
        done = subprocess.run(
            ["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return done.stdout.strip() if done.returncode == 0 else "?"


def _diffs(got: np.ndarray, case: Any) -> dict[str, float]:
    diff = np.abs(got - case.engine_logprobs[case.prompt :])[case.sampled]
    return {"logprob_abs_diff_mean": float(diff.mean()), "logprob_abs_diff_max": float(diff.max())}


def forward_figures(model: Any, case: Any, *, lifted: bool) -> dict[str, dict[str, float]]:
    """{r3_off, r3_on} -> |Δ log p| mean/max and routing agreement, islands `lifted` or stock."""
    import contextlib

    from miles.utils.replay_base import routing_replay_manager

    from integration_tests.megatron.parity import (
        agreement,
        fill_replay,
        response_logprobs,
        routing_of,
    )
    from integration_tests.megatron.precision import float64_islands

    recorded = np.asarray(case.sample.rollout_routed_experts)
    islands = float64_islands(model, case.config.rope_theta) if lifted else contextlib.nullcontext()
    with islands:
        routing_replay_manager.stage = "fallthrough"
        own = {**_diffs(response_logprobs(model, case), case)}
        own["routing_agreement"] = agreement(routing_of(model, case), recorded)
        routing_replay_manager.stage = "replay_forward"
        try:
            fill_replay(model, case, recorded)
            replay_agreement = agreement(routing_of(model, case), recorded)
            routing_replay_manager.clear_all_forward()
            replayed = {**_diffs(response_logprobs(model, case), case)}
        finally:
            routing_replay_manager.stage = "fallthrough"
            routing_replay_manager.clear_all()
    replayed["routing_agreement"] = replay_agreement
    return {"r3_off": own, "r3_on": replayed}


def gradient_figures(model: Any, case: Any) -> dict[str, float]:
    """Miles' loss on Megatron's logits (TIS, reducer, R3, float64 islands lifted) vs the reference
    trainer's gradient: per-parameter relative error."""
    import torch

    from integration_tests.megatron.mapping import from_megatron, megatron_tensors
    from integration_tests.megatron.parity import (
        forward_logits,
        miles_batch,
        miles_loss_args,
        miles_loss_backward,
        reference_gradient,
        relative_errors,
        replayed,
        response_logprobs,
    )
    from integration_tests.megatron.precision import float64_islands
    from rl360_ext.reference.trainer.trainer import Trainer, TrainerConfig

    config = TrainerConfig(unversioned_as=0, eps_clip_high=0.28, use_tis=True)
    reference = reference_gradient(case, config)
    weights = {name: value.copy() for name, value in case.weights.items()}
    args = miles_loss_args(Trainer(case.config, weights, config))
    rows = np.asarray(case.sample.rollout_routed_experts)
    model.zero_grad(set_to_none=True)
    try:
        with float64_islands(model, case.config.rope_theta):
            old = torch.from_numpy(replayed(model, case, rows, "replay_forward", response_logprobs).copy())
            out = replayed(
                model, case, rows, "replay_backward", lambda m, c: forward_logits(m, c.sample.tokens)
            )
            loss = miles_loss_backward(args, miles_batch(case, old), out, true_on_policy=True)
        errors = relative_errors(from_megatron(megatron_tensors(model, grads=True), case.config), reference)
    finally:
        model.zero_grad(set_to_none=True)
    return {
        "parameters": float(len(errors)),
        "max_relative_error": max(errors.values()),
        "median_relative_error": float(np.median(list(errors.values()))),
        "miles_loss": loss,
    }


def throughput(model: Any, vocab_size: int, samples: int, length: int, seed: int) -> dict[str, float]:
    """Forward+backward tokens/s of `samples` random sequences of `length` (as the reference's)."""
    import torch

    from integration_tests.megatron.parity import forward_logits

    rng = np.random.default_rng(seed)

    def step(tokens: np.ndarray) -> None:
        first = max(1, len(tokens) // 4)
        model.zero_grad(set_to_none=True)
        out = forward_logits(model, tokens.tolist())[0, first - 1 : -1]
        target = torch.from_numpy(tokens[first:])[:, None]
        picked = torch.log_softmax(out, dim=-1).gather(1, target)[:, 0]
        (picked * (-1.0 / len(picked))).sum().backward()

    step(rng.integers(0, vocab_size, length))  # warm-up, untimed
    batch = [rng.integers(0, vocab_size, length) for _ in range(samples)]
    started = time.perf_counter()
    for tokens in batch:
        step(tokens)
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    tokens_total = float(samples * length)
    return {"tokens": tokens_total, "seconds": seconds, "tokens_per_s": tokens_total / seconds}


def measure(seed: int) -> dict[str, Any]:
    """Every figure, in the JSON shape rl360_ext/local/bench/megatron.py reads."""
    import torch
    from miles.utils.replay_base import routing_replay_manager

    from integration_tests.megatron.mapping import build_gpt_model, load_into
    from integration_tests.megatron.parity import MergedCase
    from integration_tests.megatron.world import single_rank_world
    from rl360_ext.local.bench.trainer import (
        DEMO_SAMPLE_TOKENS,
        DEMO_SAMPLES,
        conversation,
        conversation_sample,
    )
    from rl360_ext.reference.engine.engine import EngineConfig, TinyEngine
    from rl360_ext.reference.engine.model import init_weights

    _say("float64 tiny engine conversation (the reference bench's)")
    engine = TinyEngine(EngineConfig(seed=seed, dtype="float64"))
    tokens, mask, recorded, routing, _ = conversation(engine, seed)
    config = engine.model_config
    sample = conversation_sample(tokens, mask, recorded, routing)
    case = MergedCase(sample, recorded, config, init_weights(config, seed))
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "seed": seed,
        "conversation": {
            "tokens": float(len(tokens)),
            "sampled_tokens": float(mask.sum()),
            "routing_rows": float(routing.shape[0] * routing.shape[1]),
        },
        "versions": {
            "miles": _commit(os.environ.get("MILES_SRC")),
            "megatron": _commit(os.environ.get("MEGATRON_SRC")),
            "torch": str(torch.__version__),
            "torch_threads": float(torch.get_num_threads()),
        },
    }
    with (
        tempfile.TemporaryDirectory(prefix="rl360-megatron-bench-") as store,
        single_rank_world(Path(store)) as shims,
    ):
        results["shims"] = list(shims)
        routing_replay_manager.enabled = True  # as Miles' actor sets it from --use-routing-replay
        routing_replay_manager.stage = "fallthrough"
        model = build_gpt_model(config, torch.float64)
        load_into(model, case.weights, config)
        try:
            _say("forward and routing, float32 islands as Megatron has them, then lifted")
            results["forward"] = {
                "stock": forward_figures(model, case, lifted=False),
                "lifted": forward_figures(model, case, lifted=True),
            }
            _say("gradient through Miles' loss vs the reference trainer")
            results["gradient"] = gradient_figures(model, case)
            _say(f"forward+backward, {DEMO_SAMPLES} x {DEMO_SAMPLE_TOKENS} tokens")
            results["demo_size"] = throughput(
                model, config.vocab_size, DEMO_SAMPLES, DEMO_SAMPLE_TOKENS, seed
            )
        finally:
            routing_replay_manager.clear_all()
            routing_replay_manager.enabled = False
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration_tests.megatron.bench", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="Where to write the JSON figures.")
    parser.add_argument("--seed", type=int, default=0, help="The engine's seed (the reference bench's: 0).")
    options = parser.parse_args(argv)
    problem = _import_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        return EXIT_UNAVAILABLE
    results = measure(options.seed)
    options.out.write_text(json.dumps(results, indent=2, sort_keys=True))
    _say(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
