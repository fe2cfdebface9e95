"""The tiny engine's configuration: one dataclass, the single source of every default and flag.

Owns `EngineConfig` (the analogue of SGLang's `ServerArgs`: model shape, cache, context, chunked
prefill, served name, bind address, bearer token, fault injection), its validation, and the help
text of each field, the docstring under it (read by `rl360_ext.util.fielddocs.field_docs`).
`rl360 engine serve` derives its flags from these fields (`rl360_ext.cli.engine`); a field's
`metadata` may rename its flag (`flag`), bound it (`min`), or give the text -> value parser of a
flag that is not a plain value (`parse`). It does not run anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from rl360_ext.reference.engine.faults import FaultConfig

CHUNKED_PREFILL_DISABLED = -1


@dataclass
class EngineConfig:
    """Everything `rl360 engine serve` and `TinyEngine` take; defaults are the flags' defaults."""

    host: str = "127.0.0.1"
    """Bind address."""
    port: int = 30000
    """Port."""
    seed: int = 0
    """Seed of the deterministic weights."""
    layers: int = field(default=4, metadata={"min": 1})
    """Transformer layers."""
    experts: int = field(default=8, metadata={"min": 1})
    """MoE experts per layer."""
    top_k: int = field(default=2, metadata={"min": 1})
    """Experts routed per token."""
    kv_capacity: int = field(default=65536, metadata={"min": 0})
    """Prefix KV cache capacity in tokens (0 disables it)."""
    context_length: int = field(default=32768, metadata={"min": 2})
    """Maximum prompt + output tokens (and the largest max_new_tokens a request may ask for)."""
    chunked_prefill_size: int = 512
    """Prefill at most this many tokens per model step, so a short request waits at most one chunk
    behind a long prompt (SGLang's --chunked-prefill-size; -1 disables chunking)."""
    model_name: str = "rl360-tiny-moe"
    """Served model name (/v1/models)."""
    tokenizer_dir: str | None = field(default=None, metadata={"flag": "tokenizer", "path": True})
    """Tokenizer directory (default: the built-in one)."""
    weights_path: str | None = field(default=None, metadata={"flag": "weights", "path": True})
    """Start from weights saved by `save-weights`."""
    dtype: str = "float64"
    """The forward's arithmetic: float64, or float32 (its log-probs then differ from a float64
    trainer's, as SGLang's bf16 differs from Megatron's fp32)."""
    api_key: str | None = field(default=None, repr=False)
    """Require `Authorization: Bearer <key>` on every route but /health (SGLang's --api-key)."""
    faults: FaultConfig = field(default_factory=FaultConfig, metadata={"parse": FaultConfig.parse_flag})
    """Fault injection, e.g. error_rate=0.1,latency_s=0.2,abort_rate=0.05,seed=1."""

    def __post_init__(self) -> None:
        for item in fields(self):
            minimum = item.metadata.get("min")
            value = getattr(self, item.name)
            if minimum is not None and value < minimum:
                raise ValueError(f"{item.name} must be >= {minimum}, got {value}")
        if self.chunked_prefill_size != CHUNKED_PREFILL_DISABLED and self.chunked_prefill_size < 1:
            raise ValueError(
                f"chunked_prefill_size must be >= 1 or -1 (disabled), got {self.chunked_prefill_size}"
            )
        if self.dtype not in ("float64", "float32"):
            raise ValueError(f"dtype must be float64 or float32, got {self.dtype!r}")
        if self.api_key == "":
            raise ValueError("api_key must not be empty (leave it unset for no token)")

    @property
    def prefill_chunk(self) -> int | None:
        """Tokens per prefill step, or None when chunked prefill is disabled."""
        return None if self.chunked_prefill_size == CHUNKED_PREFILL_DISABLED else self.chunked_prefill_size
