"""The tiny engine's model: a decoder-only MoE transformer in numpy (float64, CPU).

Owns the architecture (token embedding, RMSNorm, multi-head causal attention with RoPE, a
mixture-of-experts SwiGLU feed-forward per layer with a softmax router, top-k experts and
renormalized gates, a separate LM head), deterministic weights from a seed, weight save/load
(`.npz`), the incremental forward over new positions given a KV prefix (recording, per position
and layer, the top-k expert ids), and a full forward that returns per-position logprobs.
It does not own caching across requests (`cache.py`), sampling or the protocol (`engine.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

DTYPE = np.float64
COMPUTE_DTYPES = {"float64": np.float64, "float32": np.float32}  # `--dtype`: the forward's arithmetic
ATTENTION_CHUNK = 256  # queries per attention block in long prefills (bounds memory)


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the tiny MoE transformer. Defaults keep a 60-turn, 8K-token chat fast on 2 cores."""

    vocab_size: int
    """Token ids the model embeds and scores."""
    layers: int = 4
    """Transformer layers (each an MoE layer)."""
    experts: int = 8
    """Experts per layer."""
    top_k: int = 2
    """Experts each token is routed to."""
    d_model: int = 64
    """Hidden size."""
    heads: int = 4
    """Attention heads."""
    head_dim: int = 16
    """Size of one attention head."""
    expert_hidden: int = 64
    """Hidden size of one expert's MLP."""
    rope_theta: float = 10000.0
    """RoPE base."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "layers",
            "experts",
            "top_k",
            "d_model",
            "heads",
            "head_dim",
            "expert_hidden",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= experts ({self.experts})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")


@dataclass
class KVState:
    """Per-request KV for positions [0, length): keys/values shaped [layers, heads, capacity, head_dim]."""

    keys: np.ndarray
    values: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, config: ModelConfig, capacity: int = 256) -> KVState:
        shape = (config.layers, config.heads, max(capacity, 1), config.head_dim)
        return cls(np.zeros(shape, DTYPE), np.zeros(shape, DTYPE), 0)

    @classmethod
    def from_prefix(cls, keys: np.ndarray, values: np.ndarray, spare: int = 256) -> KVState:
        """Own copies of [layers, heads, n, head_dim] arrays, with room for `spare` more positions."""
        layers, heads, n, head_dim = keys.shape
        shape = (layers, heads, n + max(spare, 1), head_dim)
        state = cls(np.zeros(shape, DTYPE), np.zeros(shape, DTYPE), n)
        state.keys[:, :, :n] = keys
        state.values[:, :, :n] = values
        return state

    def reserve(self, extra: int) -> None:
        needed = self.length + extra
        capacity = self.keys.shape[2]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity)
        pad = ((0, 0), (0, 0), (0, new_capacity - capacity), (0, 0))
        self.keys = np.pad(self.keys, pad)
        self.values = np.pad(self.values, pad)

    def slice(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the KV rows for positions [start, end): two [layers, heads, end-start, head_dim]."""
        return self.keys[:, :, start:end].copy(), self.values[:, :, start:end].copy()


@dataclass
class ForwardOutput:
    """What one forward over new positions produced."""

    logits: np.ndarray  # [n, vocab] (only the rows asked for)
    routing: np.ndarray  # [n, layers, top_k] int32 expert ids, best first


WEIGHT_NAMES_GLOBAL = ("embed", "final_norm", "lm_head")
WEIGHT_NAMES_LAYER = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "router", "w_gate", "w_up", "w_down")


def init_weights(config: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Deterministic weights for `config` from `seed` (same seed, same config -> same bytes)."""
    rng = np.random.default_rng(seed)
    d, hd, heads, e, f = config.d_model, config.head_dim, config.heads, config.experts, config.expert_hidden

    def normal(shape: tuple[int, ...], fan_in: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * gain / np.sqrt(fan_in)).astype(DTYPE)

    weights = {
        "embed": normal((config.vocab_size, d), 1),
        "final_norm": np.ones(d, DTYPE),
        "lm_head": normal((d, config.vocab_size), d, gain=3.0),
    }
    for layer in range(config.layers):
        layer_weights = {
            "attn_norm": np.ones(d, DTYPE),
            "wq": normal((d, heads * hd), d),
            "wk": normal((d, heads * hd), d),
            "wv": normal((d, heads * hd), d),
            "wo": normal((heads * hd, d), heads * hd, gain=0.5),
            "ffn_norm": np.ones(d, DTYPE),
            "router": normal((d, e), d, gain=2.0),
            "w_gate": normal((e, d, f), d),
            "w_up": normal((e, d, f), d),
            "w_down": normal((e, f, d), f, gain=0.5),
        }
        weights.update({f"layers.{layer}.{name}": value for name, value in layer_weights.items()})
    return weights


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {name: value.shape for name, value in init_weights(config, 0).items()}


def save_weights(path: str | Path, config: ModelConfig, weights: dict[str, np.ndarray]) -> Path:
    """Write weights and the config to one `.npz` file."""
    out = Path(path)
    if out.suffix != ".npz":
        out = out / "weights.npz" if out.is_dir() or not out.suffix else out.with_suffix(".npz")
    out.parent.mkdir(parents=True, exist_ok=True)
    config_fields = {f"config.{k}": np.asarray(v) for k, v in asdict(config).items()}
    np.savez(out, **config_fields, **weights)
    return out


def resolve_weights_path(path: str | Path) -> Path:
    """A `.npz` file, or a directory holding `weights.npz`."""
    candidate = Path(path)
    if candidate.is_dir():
        candidate = candidate / "weights.npz"
    if not candidate.is_file():
        raise FileNotFoundError(
            f"no weights file at {path} (expected a .npz file or a directory with weights.npz)"
        )
    return candidate


def load_weights(path: str | Path, config: ModelConfig) -> dict[str, np.ndarray]:
    """Load a `.npz` written by save_weights; every tensor must match `config`'s shapes."""
    shapes = expected_shapes(config)
    with np.load(resolve_weights_path(path)) as data:
        saved = {name: data[name] for name in data.files if not name.startswith("config.")}
        saved_config = {
            name[len("config.") :]: data[name].item() for name in data.files if name.startswith("config.")
        }
    for key, value in asdict(config).items():
        if key in saved_config and saved_config[key] != value:
            raise ValueError(
                f"weights were saved for {key}={saved_config[key]}, this engine has {key}={value}"
            )
    missing = sorted(set(shapes) - set(saved))
    if missing:
        raise ValueError(f"weights file lacks tensors: {', '.join(missing[:5])}")
    for name, shape in shapes.items():
        if saved[name].shape != shape:
            raise ValueError(f"tensor {name} has shape {saved[name].shape}, expected {shape}")
    return {name: saved[name].astype(DTYPE) for name in shapes}


def perturb_weights(weights: dict[str, np.ndarray], eps: float, seed: int) -> dict[str, np.ndarray]:
    """Add eps-scaled Gaussian noise to every tensor (deterministic per seed): a stand-in training step."""
    rng = np.random.default_rng(seed + 1_000_003)
    return {
        name: (value + eps * rng.standard_normal(value.shape)).astype(DTYPE)
        for name, value in weights.items()
    }


@lru_cache(maxsize=8)
def _causal_bias(m: int) -> np.ndarray:
    """[m, m] additive mask: 0 on and below the diagonal, -inf above."""
    return np.triu(np.full((m, m), -np.inf, DTYPE), k=1)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis."""
    return _log_softmax(logits)


class TinyMoEModel:
    """The model: weights plus the forward passes. Not thread-safe; the engine serializes calls.

    `dtype` is the forward's arithmetic: "float64" (the default) or "float32" (every matmul, norm
    and softmax in float32, as a GPU engine's low precision differs from a trainer's). Weights and
    the KV cache stay float64 arrays; in float32 mode the KV rows hold float32-rounded values.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, np.ndarray] | None = None,
        seed: int = 0,
        dtype: str = "float64",
    ) -> None:
        if dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {dtype!r}")
        self.config = config
        self.dtype = np.dtype(COMPUTE_DTYPES[dtype])
        self.weights = weights if weights is not None else init_weights(config, seed)
        inv_freq = 1.0 / (
            config.rope_theta ** (np.arange(0, config.head_dim, 2, dtype=DTYPE) / config.head_dim)
        )
        self._inv_freq = inv_freq

    @property
    def weights(self) -> dict[str, np.ndarray]:
        return self._weights

    @weights.setter
    def weights(self, value: dict[str, np.ndarray]) -> None:
        self._weights = value
        self._compute = value if self.dtype == DTYPE else {k: v.astype(self.dtype) for k, v in value.items()}

    @classmethod
    def from_seed(cls, config: ModelConfig, seed: int, dtype: str = "float64") -> TinyMoEModel:
        return cls(config, init_weights(config, seed), dtype=dtype)

    def load(self, path: str | Path) -> None:
        """Replace the weights with those in `path` (validated before anything changes)."""
        self.weights = load_weights(path, self.config)

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate [n, heads, head_dim] by position (half-split layout)."""
        angles = positions[:, None].astype(DTYPE) * self._inv_freq[None, :]
        cos = np.cos(angles)[:, None, :].astype(self.dtype, copy=False)
        sin = np.sin(angles)[:, None, :].astype(self.dtype, copy=False)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    def _attention(self, layer: int, h: np.ndarray, kv: KVState, start: int) -> np.ndarray:
        cfg, w = self.config, self._compute
        n = h.shape[0]
        prefix = f"layers.{layer}."
        positions = np.arange(start, start + n)
        q = self._rope((h @ w[prefix + "wq"]).reshape(n, cfg.heads, cfg.head_dim), positions)
        k = self._rope((h @ w[prefix + "wk"]).reshape(n, cfg.heads, cfg.head_dim), positions)
        v = (h @ w[prefix + "wv"]).reshape(n, cfg.heads, cfg.head_dim)
        kv.keys[layer, :, start : start + n] = k.transpose(1, 0, 2)
        kv.values[layer, :, start : start + n] = v.transpose(1, 0, 2)
        keys = kv.keys[layer].transpose(0, 2, 1)  # [heads, head_dim, capacity] (a view)
        values = kv.values[layer]  # [heads, capacity, head_dim]
        q = q.transpose(1, 0, 2) * (1.0 / np.sqrt(cfg.head_dim))  # [heads, n, head_dim]
        out = np.empty((n, cfg.heads, cfg.head_dim), self.dtype)
        for q0 in range(0, n, ATTENTION_CHUNK):
            q1 = min(n, q0 + ATTENTION_CHUNK)
            visible = start + q1  # keys the last query of this block may see
            block_keys = keys[:, :, :visible].astype(self.dtype, copy=False)
            scores = np.matmul(q[:, q0:q1], block_keys)  # [heads, m, visible]
            if q1 - q0 > 1:  # causal mask inside the block's own new positions
                scores[:, :, start + q0 :] += _causal_bias(q1 - q0)
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            total_weight = scores.sum(axis=-1, keepdims=True)
            block_values = values[:, :visible].astype(self.dtype, copy=False)
            out[q0:q1] = (np.matmul(scores, block_values) / total_weight).transpose(1, 0, 2)
        return out.reshape(n, cfg.heads * cfg.head_dim) @ w[prefix + "wo"]

    def _moe(self, layer: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cfg, w = self.config, self._compute
        prefix = f"layers.{layer}."
        router_probs = np.exp(_log_softmax(h @ w[prefix + "router"]))  # [n, experts]
        chosen = np.argsort(-router_probs, axis=-1, kind="stable")[:, : cfg.top_k]  # best first
        gates = np.take_along_axis(router_probs, chosen, axis=-1)
        gates /= gates.sum(axis=-1, keepdims=True)
        out = np.zeros_like(h)
        w_gate, w_up, w_down = w[prefix + "w_gate"], w[prefix + "w_up"], w[prefix + "w_down"]
        for expert in np.unique(chosen):
            rows, slots = np.nonzero(chosen == expert)
            x = h[rows]
            gate = x @ w_gate[expert]
            hidden = gate / (1.0 + np.exp(-gate)) * (x @ w_up[expert])  # SwiGLU
            out[rows] += gates[rows, slots][:, None] * (hidden @ w_down[expert])
        return out, chosen.astype(np.int32)

    def forward(self, token_ids: np.ndarray, kv: KVState, logits_for: str = "last") -> ForwardOutput:
        """Run new positions [kv.length, kv.length + n) given the KV prefix; append their KV.

        `logits_for` is "last" (logits of the last new position only) or "all".
        """
        cfg, w = self.config, self._compute
        tokens = np.asarray(token_ids, dtype=np.int64)
        n = tokens.shape[0]
        if n == 0:
            raise ValueError("forward needs at least one new token")
        start = kv.length
        kv.reserve(n)
        x = w["embed"][tokens]
        routing = np.empty((n, cfg.layers, cfg.top_k), np.int32)
        for layer in range(cfg.layers):
            prefix = f"layers.{layer}."
            x = x + self._attention(layer, _rms_norm(x, w[prefix + "attn_norm"], cfg.norm_eps), kv, start)
            moe_out, chosen = self._moe(layer, _rms_norm(x, w[prefix + "ffn_norm"], cfg.norm_eps))
            x = x + moe_out
            routing[:, layer] = chosen
        kv.length = start + n
        rows = x if logits_for == "all" else x[-1:]
        logits = _rms_norm(rows, w["final_norm"], cfg.norm_eps) @ w["lm_head"]
        return ForwardOutput(logits=logits, routing=routing)

    def sequence_logprobs(self, token_ids: list[int] | np.ndarray) -> np.ndarray:
        """One full forward over the whole sequence: logprob of token i given tokens < i, for i >= 1.

        Returns an array of length len(token_ids) - 1 (log-softmax of the raw logits, no temperature).
        """
        tokens = np.asarray(token_ids, dtype=np.int64)
        if tokens.shape[0] < 2:
            return np.zeros(0, DTYPE)
        kv = KVState.empty(self.config, tokens.shape[0])
        out = self.forward(tokens[:-1], kv, logits_for="all")
        logprobs = _log_softmax(out.logits)
        return logprobs[np.arange(tokens.shape[0] - 1), tokens[1:]]

    def sequence_routing(self, token_ids: list[int] | np.ndarray) -> np.ndarray:
        """Routing [n, layers, top_k] of one full forward over `token_ids` (for comparisons)."""
        tokens = np.asarray(token_ids, dtype=np.int64)
        kv = KVState.empty(self.config, tokens.shape[0])
        return self.forward(tokens, kv).routing
