"""`rl360 bench engine`: the tiny engine's speed at its default size on this machine.

Measures prefill tokens/s (one fresh 2,048-token prompt), decode tokens/s (256 tokens after it),
and the wall time of a 60-turn, ~8K-token agent conversation through the engine logic layer
(each turn appends ~100 prompt tokens to the whole history and generates 30), with the prefix
cache against a no-cache baseline measured in the same run. It does not assert anything.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np

from rl360_ext.reference.engine.engine import EngineConfig, TinyEngine
from rl360_ext.reference.engine.model import KVState
from rl360_ext.reference.engine.protocol import GenerateRequest, SamplingParams
from rl360_ext.util.progress import stage

PREFILL_TOKENS = 2048
DECODE_TOKENS = 256
TURNS = 60
TURN_PROMPT_TOKENS = 100
TURN_OUTPUT_TOKENS = 30


@dataclass
class ConversationResult:
    wall_s: float
    total_tokens: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_conversation(
    engine: TinyEngine,
    turns: int = TURNS,
    turn_prompt_tokens: int = TURN_PROMPT_TOKENS,
    turn_output_tokens: int = TURN_OUTPUT_TOKENS,
    seed: int = 0,
) -> ConversationResult:
    """A multi-turn chat: every turn resends the whole history plus new tokens (token-in/token-out)."""
    rng = np.random.default_rng(seed)
    history: list[int] = []
    prompt_total = cached_total = 0
    started = time.perf_counter()
    for turn in range(turns):
        history += rng.integers(0, engine.vocab_size, turn_prompt_tokens).tolist()
        request = GenerateRequest(
            input_ids=list(history),
            sampling=SamplingParams(
                max_new_tokens=turn_output_tokens, temperature=1.0, ignore_eos=True, sampling_seed=seed + turn
            ),
        )
        meta = engine.generate(request)
        history += meta["output_ids"]
        prompt_total += meta["meta_info"]["prompt_tokens"]
        cached_total += meta["meta_info"]["cached_tokens"]
    return ConversationResult(time.perf_counter() - started, len(history), prompt_total, cached_total)


def measure_throughput(engine: TinyEngine) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of the bare model at the engine's size."""
    model = engine.model
    tokens = np.random.default_rng(1).integers(0, engine.vocab_size, PREFILL_TOKENS)
    kv = KVState.empty(model.config, PREFILL_TOKENS + DECODE_TOKENS)
    started = time.perf_counter()
    out = model.forward(tokens, kv)
    prefill_s = time.perf_counter() - started
    token = int(np.argmax(out.logits[-1]))
    started = time.perf_counter()
    for _ in range(DECODE_TOKENS):
        out = model.forward(np.asarray([token]), kv)
        token = int(np.argmax(out.logits[-1]))
    decode_s = time.perf_counter() - started
    return PREFILL_TOKENS / prefill_s, DECODE_TOKENS / decode_s


def collect() -> dict[str, object]:
    config = EngineConfig()
    cached_engine = TinyEngine(config)
    stage("prefill and decode throughput")
    prefill_tps, decode_tps = measure_throughput(cached_engine)
    stage(f"{TURNS}-turn conversation with the prefix cache")
    cached = run_conversation(cached_engine)
    stage(f"{TURNS}-turn conversation without a cache (baseline, the slow part)")
    baseline = run_conversation(TinyEngine(EngineConfig(kv_capacity=0)))
    return {
        "model": {
            "layers": config.layers,
            "experts": config.experts,
            "top_k": config.top_k,
            "d_model": cached_engine.model_config.d_model,
            "vocab": cached_engine.vocab_size,
        },
        "prefill_tokens_per_s": prefill_tps,
        "decode_tokens_per_s": decode_tps,
        "conversation": {
            "turns": TURNS,
            "cached": {**asdict(cached), "hit_rate": cached.hit_rate},
            "no_cache_baseline": {**asdict(baseline), "hit_rate": baseline.hit_rate},
            "speedup": baseline.wall_s / cached.wall_s if cached.wall_s else None,
        },
    }


def main(as_json: bool) -> None:
    results = collect()
    if as_json:
        print(json.dumps(results, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    conv = results["conversation"]
    assert isinstance(conv, dict)
    table = Table("measure", "value", title="tiny engine (default size: 4 layers, 8 experts, top-2)")
    table.add_row(f"prefill ({PREFILL_TOKENS} tokens)", f"{results['prefill_tokens_per_s']:,.0f} tok/s")
    table.add_row(f"decode ({DECODE_TOKENS} tokens)", f"{results['decode_tokens_per_s']:,.0f} tok/s")
    for label, key in (("with prefix cache", "cached"), ("no-cache baseline", "no_cache_baseline")):
        row = conv[key]
        table.add_row(
            f"{TURNS}-turn chat, {label}",
            f"{row['wall_s']:.2f} s ({row['total_tokens']} tokens, hit rate {row['hit_rate']:.0%})",
        )
    table.add_row("cache speedup", f"{conv['speedup']:.1f}x")
    Console().print(table)
