"""The tiny engine's weights <-> a Megatron `GPTModel`'s state dict, and the `GPTModel` they fit.

Owns the architecture translation (rl360_ext/reference/engine/model.py onto Megatron-core's local
layer spec): token embedding -> `embedding.word_embeddings`; RMSNorm scales -> `input_layernorm`,
`pre_mlp_layernorm`, `decoder.final_layernorm`; q/k/v -> the fused `linear_qkv`, rows grouped per
query group as [q, k, v] (the tiny engine is multi-head: one query group per head); `wo` ->
`linear_proj`; router `[d, E]` -> `router.weight [E, d]`; SwiGLU `w_gate`/`w_up` -> one
`linear_fc1` per expert, gate rows first (Megatron's `glu` chunks it in two and gates with the
first half); `w_down` -> `linear_fc2`; the LM head -> `output_layer` (untied). Positions: RoPE,
half-split rotation, base `rope_theta`, as Megatron's non-interleaved rotary embedding. Softmax
router, top-k, gates renormalised over the chosen experts (Megatron's `moe_router_pre_softmax`
False: softmax over the top-k logits, the same values); no biases, no shared expert, no aux loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rl360_ext.reference.engine.model import ModelConfig

Weights = dict[str, np.ndarray]


def transformer_config(config: ModelConfig, dtype: Any) -> Any:
    """Megatron's TransformerConfig of the tiny engine's architecture, every fused kernel off."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=config.layers,
        hidden_size=config.d_model,
        num_attention_heads=config.heads,
        num_query_groups=config.heads,
        kv_channels=config.head_dim,
        ffn_hidden_size=config.expert_hidden,
        num_moe_experts=config.experts,
        moe_router_topk=config.top_k,
        moe_ffn_hidden_size=config.expert_hidden,
        moe_router_pre_softmax=False,
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="allgather",  # cpu_shims.py, shim 4
        normalization="RMSNorm",
        layernorm_epsilon=config.norm_eps,
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        params_dtype=dtype,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


def build_gpt_model(config: ModelConfig, dtype: Any) -> Any:
    """A Megatron `GPTModel` (local spec, RMSNorm, RoPE, untied head), every tensor in `dtype`.

    The router weight and the norm scales are created float32 whatever `params_dtype` says
    (router.py allocates the gate in float32; the local RMSNorm too), so the module is cast.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    model = GPTModel(
        transformer_config(config, dtype),
        get_gpt_layer_local_spec(num_experts=config.experts, normalization="RMSNorm"),
        vocab_size=config.vocab_size,
        max_sequence_length=1 << 16,
        position_embedding_type="rope",
        rotary_base=int(config.rope_theta),
        share_embeddings_and_output_weights=False,
    )
    return model.to(dtype)


def _qkv(weights: Weights, prefix: str, config: ModelConfig) -> np.ndarray:
    heads, hd, d = config.heads, config.head_dim, config.d_model
    parts = [weights[prefix + name].T.reshape(heads, hd, d) for name in ("wq", "wk", "wv")]
    return np.stack(parts, axis=1).reshape(3 * heads * hd, d)


def to_megatron(weights: Weights, config: ModelConfig) -> dict[str, np.ndarray]:
    """The tiny engine's tensors as a Megatron `GPTModel` state dict (numpy, same values)."""
    out = {
        "embedding.word_embeddings.weight": weights["embed"],
        "decoder.final_layernorm.weight": weights["final_norm"],
        "output_layer.weight": weights["lm_head"].T,
    }
    for layer in range(config.layers):
        p, m = f"layers.{layer}.", f"decoder.layers.{layer}."
        out[m + "input_layernorm.weight"] = weights[p + "attn_norm"]
        out[m + "self_attention.linear_qkv.weight"] = _qkv(weights, p, config)
        out[m + "self_attention.linear_proj.weight"] = weights[p + "wo"].T
        out[m + "pre_mlp_layernorm.weight"] = weights[p + "ffn_norm"]
        out[m + "mlp.router.weight"] = weights[p + "router"].T
        for e in range(config.experts):
            x = f"{m}mlp.experts.local_experts.{e}."
            fc1 = np.concatenate([weights[p + "w_gate"][e].T, weights[p + "w_up"][e].T], axis=0)
            out[x + "linear_fc1.weight"] = fc1
            out[x + "linear_fc2.weight"] = weights[p + "w_down"][e].T
    return {name: np.ascontiguousarray(value) for name, value in out.items()}


def from_megatron(state: dict[str, np.ndarray], config: ModelConfig) -> Weights:
    """The inverse of `to_megatron`: a Megatron state dict (or its gradients) in tiny-engine names."""
    heads, hd, d, f = config.heads, config.head_dim, config.d_model, config.expert_hidden
    out = {
        "embed": state["embedding.word_embeddings.weight"],
        "final_norm": state["decoder.final_layernorm.weight"],
        "lm_head": state["output_layer.weight"].T,
    }
    for layer in range(config.layers):
        p, m = f"layers.{layer}.", f"decoder.layers.{layer}."
        qkv = state[m + "self_attention.linear_qkv.weight"].reshape(heads, 3, hd, d)
        for i, name in enumerate(("wq", "wk", "wv")):
            out[p + name] = qkv[:, i].reshape(heads * hd, d).T
        out[p + "attn_norm"] = state[m + "input_layernorm.weight"]
        out[p + "wo"] = state[m + "self_attention.linear_proj.weight"].T
        out[p + "ffn_norm"] = state[m + "pre_mlp_layernorm.weight"]
        out[p + "router"] = state[m + "mlp.router.weight"].T
        experts = [f"{m}mlp.experts.local_experts.{e}." for e in range(config.experts)]
        out[p + "w_gate"] = np.stack([state[x + "linear_fc1.weight"][:f].T for x in experts])
        out[p + "w_up"] = np.stack([state[x + "linear_fc1.weight"][f:].T for x in experts])
        out[p + "w_down"] = np.stack([state[x + "linear_fc2.weight"].T for x in experts])
    return {name: np.ascontiguousarray(value) for name, value in out.items()}


def load_into(model: Any, weights: Weights, config: ModelConfig) -> None:
    """Copy the tiny engine's weights into `model` (strict: every Megatron parameter is set)."""
    import torch

    dtype = next(model.parameters()).dtype
    state = {name: torch.from_numpy(value).to(dtype) for name, value in to_megatron(weights, config).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not name.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")


def megatron_tensors(model: Any, *, grads: bool = False) -> dict[str, np.ndarray]:
    """The model's parameters (or their `.grad`s, zeros where none) as numpy, by Megatron name."""
    out = {}
    for name, param in model.named_parameters():
        tensor = param.grad if grads else param
        out[name] = np.zeros(tuple(param.shape)) if tensor is None else tensor.detach().cpu().numpy()
    return out
