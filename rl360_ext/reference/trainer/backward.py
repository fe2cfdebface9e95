"""The tiny MoE model's training forward and its hand-written backward pass (numpy, float64).

Owns one sequence's forward that keeps what the backward needs (the "tape"), the optional
routing replay (R3: each MoE layer uses the replayed expert ids instead of its own top-k, and the
gradient flows through those experts' renormalized gate values, as Megatron's routing replay
gathers `scores` at the replayed indices), and the reverse pass that turns d(loss)/d(log-prob of
each target token) into a gradient for every parameter: token embedding, attention (q/k/v/o
projections through RoPE and the causal softmax), the RMSNorm scales, router, experts (SwiGLU)
and the LM head. The architecture and the weight names are the tiny engine's
(`rl360_ext.reference.engine.model`); the same `.npz` files go both ways.

Attention runs in query blocks of `ATTENTION_CHUNK` like the engine, and the backward recomputes
each block's softmax from the saved log-sum-exp, so memory stays O(n * block) per layer (an
8K-token conversation fits). It does not own losses, optimizers or data (`loss.py`, `optim.py`,
`data.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rl360_ext.reference.engine.model import ATTENTION_CHUNK, ModelConfig

Weights = dict[str, np.ndarray]


@dataclass
class _ExpertTape:
    rows: np.ndarray
    slots: np.ndarray
    u: np.ndarray  # gate projection (pre-SiLU)
    s: np.ndarray  # SiLU(u)
    w: np.ndarray  # up projection
    h: np.ndarray  # s * w
    y: np.ndarray  # h @ w_down


@dataclass
class _LayerTape:
    x_in: np.ndarray
    attn_inv_rms: np.ndarray
    a: np.ndarray  # attention input after RMSNorm
    q: np.ndarray  # [heads, n, head_dim], roped and scaled by 1/sqrt(head_dim)
    k: np.ndarray  # [heads, n, head_dim], roped
    v: np.ndarray  # [heads, n, head_dim]
    lse: np.ndarray  # [heads, n] log-sum-exp of each query's scores
    o: np.ndarray  # [heads, n, head_dim] attention output before wo
    x_mid: np.ndarray
    ffn_inv_rms: np.ndarray
    b: np.ndarray  # MoE input after RMSNorm
    probs: np.ndarray  # [n, experts] router softmax
    chosen: np.ndarray  # [n, top_k] experts used (replayed or own)
    gates: np.ndarray  # [n, top_k] renormalized gate values of `chosen`
    experts: list[_ExpertTape] = field(default_factory=list)


@dataclass
class Tape:
    """What one forward kept for its backward, plus what it observed."""

    tokens: np.ndarray  # the n input positions (the sequence minus its last token)
    targets: np.ndarray  # the tokens whose log-probs were computed
    first_row: int  # position of the first target's prediction
    layers: list[_LayerTape]
    x_final: np.ndarray  # [rows, d] residual stream of the scored rows
    final_inv_rms: np.ndarray
    f: np.ndarray  # [rows, d] after the final RMSNorm
    softmax: np.ndarray  # [rows, vocab]
    own_routing: np.ndarray  # [n, layers, top_k] the model's own top-k (best first)
    used_routing: np.ndarray  # [n, layers, top_k] the ids the forward used


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inv * weight, inv


def _rms_backward(
    dy: np.ndarray, x: np.ndarray, inv: np.ndarray, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dweight) of y = x * inv * weight, inv = (mean(x^2) + eps)^-1/2."""
    dweight = (dy * x * inv).sum(axis=0)
    z = dy * weight
    dx = inv * z - (inv**3) * x * (z * x).mean(axis=-1, keepdims=True)
    return dx, dweight


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class TrainModel:
    """The tiny engine's architecture with a backward pass. Weights are float64 numpy arrays."""

    def __init__(self, config: ModelConfig, weights: Weights) -> None:
        self.config = config
        self.weights = weights
        self._inv_freq = 1.0 / (
            config.rope_theta ** (np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim)
        )

    # ---- RoPE (the engine's half-split layout) ------------------------------------------------

    def _angles(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        angles = np.arange(n)[:, None].astype(np.float64) * self._inv_freq[None, :]
        return np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]

    @staticmethod
    def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    @staticmethod
    def _rope_backward(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        half = dy.shape[-1] // 2
        d1, d2 = dy[..., :half], dy[..., half:]
        return np.concatenate([d1 * cos + d2 * sin, -d1 * sin + d2 * cos], axis=-1)

    # ---- forward ------------------------------------------------------------------------------

    def forward(
        self,
        sequence: np.ndarray,
        first_target: int,
        replay: np.ndarray | None = None,
        replay_rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, Tape]:
        """Log-probs of `sequence[first_target:]`, each given the tokens before it, and the tape.

        `replay` ([len(sequence) - 1, layers, top_k] expert ids, Miles' `rollout_routed_experts`)
        replaces every layer's top-k; None routes with the model's own top-k. `replay_rows` (bool
        [len(sequence) - 1]) limits the replay to those rows, the others routing with the model's own
        top-k (None: every row replayed).
        """
        cfg, w = self.config, self.weights
        sequence = np.asarray(sequence, dtype=np.int64)
        if sequence.ndim != 1 or len(sequence) < 2:
            raise ValueError("a training sequence needs at least 2 tokens")
        if not 1 <= first_target < len(sequence):
            raise ValueError(f"first_target must be in [1, {len(sequence) - 1}], got {first_target}")
        tokens = sequence[:-1]
        n = len(tokens)
        if replay is not None:
            replay = _checked_replay(replay, n, cfg)
            if replay_rows is not None:
                replay_rows = np.asarray(replay_rows, bool)
                if replay_rows.shape != (n,):
                    raise ValueError(f"replay_rows has shape {replay_rows.shape}, expected ({n},)")
        cos, sin = self._angles(n)
        x = w["embed"][tokens]
        own = np.empty((n, cfg.layers, cfg.top_k), np.int32)
        used = np.empty((n, cfg.layers, cfg.top_k), np.int32)
        tapes = []
        for layer in range(cfg.layers):
            p = f"layers.{layer}."
            x_in = x
            a, attn_inv = _rms(x, w[p + "attn_norm"], cfg.norm_eps)
            shape = (n, cfg.heads, cfg.head_dim)
            q = self._rope((a @ w[p + "wq"]).reshape(shape), cos, sin).transpose(1, 0, 2)
            q = q * (1.0 / np.sqrt(cfg.head_dim))
            k = self._rope((a @ w[p + "wk"]).reshape(shape), cos, sin).transpose(1, 0, 2)
            v = (a @ w[p + "wv"]).reshape(shape).transpose(1, 0, 2)
            o, lse = _attention(q, k, v)
            x_mid = x + o.transpose(1, 0, 2).reshape(n, -1) @ w[p + "wo"]
            b, ffn_inv = _rms(x_mid, w[p + "ffn_norm"], cfg.norm_eps)
            probs = np.exp(_log_softmax(b @ w[p + "router"]))
            own[:, layer] = np.argsort(-probs, axis=-1, kind="stable")[:, : cfg.top_k]
            chosen = own[:, layer] if replay is None else replay[:, layer]
            if replay is not None and replay_rows is not None:
                chosen = np.where(replay_rows[:, None], chosen, own[:, layer])
            used[:, layer] = chosen
            gates = np.take_along_axis(probs, chosen, axis=-1)
            gates = gates / gates.sum(axis=-1, keepdims=True)
            out = np.zeros_like(b)
            experts = []
            for expert in np.unique(chosen):
                rows, slots = np.nonzero(chosen == expert)
                xb = b[rows]
                u = xb @ w[p + "w_gate"][expert]
                s = u / (1.0 + np.exp(-u))
                up = xb @ w[p + "w_up"][expert]
                h = s * up
                y = h @ w[p + "w_down"][expert]
                out[rows] += gates[rows, slots][:, None] * y
                experts.append(_ExpertTape(rows, slots, u, s, up, h, y))
            x = x_mid + out
            tapes.append(
                _LayerTape(
                    x_in, attn_inv, a, q, k, v, lse, o, x_mid, ffn_inv, b, probs, chosen, gates, experts
                )
            )
        first_row = first_target - 1
        x_rows = x[first_row:]
        f, final_inv = _rms(x_rows, w["final_norm"], cfg.norm_eps)
        logprobs = _log_softmax(f @ w["lm_head"])
        targets = sequence[first_target:]
        target_logprobs = logprobs[np.arange(len(targets)), targets]
        tape = Tape(tokens, targets, first_row, tapes, x_rows, final_inv, f, np.exp(logprobs), own, used)
        return target_logprobs, tape

    # ---- backward -----------------------------------------------------------------------------

    def backward(self, tape: Tape, dlogprobs: np.ndarray, grads: Weights | None = None) -> Weights:
        """Add d(loss)/d(weights) to `grads` (zeros when None), given d(loss)/d(target log-probs)."""
        cfg, w = self.config, self.weights
        if grads is None:
            grads = {name: np.zeros_like(value) for name, value in w.items()}
        dlogprobs = np.asarray(dlogprobs, dtype=np.float64)
        if dlogprobs.shape != tape.targets.shape:
            raise ValueError(f"dlogprobs has shape {dlogprobs.shape}, expected {tape.targets.shape}")
        n = len(tape.tokens)
        dlogits = -tape.softmax * dlogprobs[:, None]
        dlogits[np.arange(len(tape.targets)), tape.targets] += dlogprobs
        grads["lm_head"] += tape.f.T @ dlogits
        df = dlogits @ w["lm_head"].T
        dx_rows, dnorm = _rms_backward(df, tape.x_final, tape.final_inv_rms, w["final_norm"])
        grads["final_norm"] += dnorm
        dx = np.zeros((n, cfg.d_model))
        dx[tape.first_row :] = dx_rows
        cos, sin = self._angles(n)
        for layer in reversed(range(cfg.layers)):
            p = f"layers.{layer}."
            t = tape.layers[layer]
            db = self._moe_backward(p, t, dx, grads)
            dmid, dnorm = _rms_backward(db, t.x_mid, t.ffn_inv_rms, w[p + "ffn_norm"])
            grads[p + "ffn_norm"] += dnorm
            dx = dx + dmid
            o_flat = t.o.transpose(1, 0, 2).reshape(n, -1)
            grads[p + "wo"] += o_flat.T @ dx
            do = (dx @ w[p + "wo"].T).reshape(n, cfg.heads, cfg.head_dim).transpose(1, 0, 2)
            dq, dk, dv = _attention_backward(t.q, t.k, t.v, t.o, t.lse, do)
            scale = 1.0 / np.sqrt(cfg.head_dim)
            dq = self._rope_backward((dq * scale).transpose(1, 0, 2), cos, sin).reshape(n, -1)
            dk = self._rope_backward(dk.transpose(1, 0, 2), cos, sin).reshape(n, -1)
            dv = dv.transpose(1, 0, 2).reshape(n, -1)
            grads[p + "wq"] += t.a.T @ dq
            grads[p + "wk"] += t.a.T @ dk
            grads[p + "wv"] += t.a.T @ dv
            da = dq @ w[p + "wq"].T + dk @ w[p + "wk"].T + dv @ w[p + "wv"].T
            din, dnorm = _rms_backward(da, t.x_in, t.attn_inv_rms, w[p + "attn_norm"])
            grads[p + "attn_norm"] += dnorm
            dx = dx + din
        np.add.at(grads["embed"], tape.tokens, dx)
        return grads

    def _moe_backward(self, p: str, t: _LayerTape, dout: np.ndarray, grads: Weights) -> np.ndarray:
        """d(loss)/d(MoE input) given d(loss)/d(MoE output); expert and router grads into `grads`."""
        w = self.weights
        db = np.zeros_like(t.b)
        dgates = np.zeros_like(t.gates)
        for expert, e in zip(np.unique(t.chosen), t.experts, strict=True):
            d_y = dout[e.rows]
            dgates[e.rows, e.slots] = (d_y * e.y).sum(axis=-1)
            dy = t.gates[e.rows, e.slots][:, None] * d_y
            grads[p + "w_down"][expert] += e.h.T @ dy
            dh = dy @ w[p + "w_down"][expert].T
            sig = 1.0 / (1.0 + np.exp(-e.u))
            du = dh * e.w * sig * (1.0 + e.u * (1.0 - sig))
            dup = dh * e.s
            xb = t.b[e.rows]
            grads[p + "w_gate"][expert] += xb.T @ du
            grads[p + "w_up"][expert] += xb.T @ dup
            db[e.rows] += du @ w[p + "w_gate"][expert].T + dup @ w[p + "w_up"][expert].T
        chosen_probs = np.take_along_axis(t.probs, t.chosen, axis=-1)
        total = chosen_probs.sum(axis=-1, keepdims=True)
        dchosen = (dgates - (dgates * t.gates).sum(axis=-1, keepdims=True)) / total
        dprobs = np.zeros_like(t.probs)
        np.put_along_axis(dprobs, t.chosen, dchosen, axis=-1)
        dlogits = t.probs * (dprobs - (dprobs * t.probs).sum(axis=-1, keepdims=True))
        grads[p + "router"] += t.b.T @ dlogits
        db += dlogits @ w[p + "router"].T
        return db


def _checked_replay(replay: np.ndarray, n: int, cfg: ModelConfig) -> np.ndarray:
    replay = np.asarray(replay)
    expected = (n, cfg.layers, cfg.top_k)
    if replay.shape != expected:
        raise ValueError(f"rollout_routed_experts has shape {replay.shape}, expected {expected}")
    replay = replay.astype(np.int64)
    if replay.size and (replay.min() < 0 or replay.max() >= cfg.experts):
        raise ValueError(f"rollout_routed_experts holds expert ids outside [0, {cfg.experts})")
    ordered = np.sort(replay, axis=-1)
    if cfg.top_k > 1 and np.any(ordered[..., 1:] == ordered[..., :-1]):
        raise ValueError("rollout_routed_experts repeats an expert within one (token, layer) row")
    return replay


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention per head, in query blocks; returns the output and each query's log-sum-exp."""
    heads, n, head_dim = q.shape
    out = np.empty((heads, n, head_dim))
    lse = np.empty((heads, n))
    for q0 in range(0, n, ATTENTION_CHUNK):
        q1 = min(n, q0 + ATTENTION_CHUNK)
        scores = _block_scores(q, k, q0, q1)
        peak = scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=-1, keepdims=True)
        out[:, q0:q1] = np.matmul(weights, v[:, :q1]) / total
        lse[:, q0:q1] = (peak + np.log(total))[..., 0]
    return out, lse


def _block_scores(q: np.ndarray, k: np.ndarray, q0: int, q1: int) -> np.ndarray:
    scores = np.matmul(q[:, q0:q1], k[:, :q1].transpose(0, 2, 1))  # [heads, m, q1]
    if q1 - q0 > 1:
        scores[:, :, q0:] += np.triu(np.full((q1 - q0, q1 - q0), -np.inf), k=1)
    return scores


def _attention_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray, do: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of the causal attention, recomputing each block's probabilities from `lse`."""
    n = q.shape[1]
    dq = np.empty_like(q)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for q0 in range(0, n, ATTENTION_CHUNK):
        q1 = min(n, q0 + ATTENTION_CHUNK)
        probs = np.exp(_block_scores(q, k, q0, q1) - lse[:, q0:q1, None])
        do_block = do[:, q0:q1]
        dprobs = np.matmul(do_block, v[:, :q1].transpose(0, 2, 1))
        row_dot = (do_block * o[:, q0:q1]).sum(axis=-1, keepdims=True)
        dscores = probs * (dprobs - row_dot)
        dq[:, q0:q1] = np.matmul(dscores, k[:, :q1])
        dk[:, :q1] += np.matmul(dscores.transpose(0, 2, 1), q[:, q0:q1])
        dv[:, :q1] += np.matmul(probs.transpose(0, 2, 1), do_block)
    return dq, dk, dv
