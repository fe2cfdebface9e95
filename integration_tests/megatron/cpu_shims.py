"""The patches that let Miles' Megatron fork (radixark/Megatron-LM, miles-main) and Miles' routing
replay run on a CPU torch.

Owns nothing else: each shim names why Megatron needs it on CPU, and refuses to apply (a
RuntimeError naming the symbol) when the name it patches is gone, so an upstream change shows up
as a clear failure rather than as a silently dead shim. Applied once per process by
`apply_cpu_shims`; the tests never undo them (the interpreter is a throwaway pytest run).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

APPLIED: list[str] = []


def _require(owner: Any, name: str, what: str) -> None:
    if not hasattr(owner, name):
        raise RuntimeError(f"cannot shim {what}: {owner!r} has no attribute {name!r} any more")


def _null_fork(_tracker: Any, name: str = "") -> contextlib.AbstractContextManager[None]:
    del name
    return contextlib.nullcontext()


def apply_cpu_shims() -> list[str]:
    """Patch torch / Megatron for CPU; returns the shims applied (idempotent)."""
    if APPLIED:
        return APPLIED
    import torch
    from megatron.core.tensor_parallel import random as megatron_random
    from megatron.core.transformer.moe import moe_utils

    # 1. Megatron places buffers and moves the router weight with
    #    `device=torch.cuda.current_device()` (router.py, moe_utils.py); on a CPU wheel that call
    #    raises "Torch not compiled with CUDA enabled". Everything lives on the CPU device instead.
    _require(torch.cuda, "current_device", "torch.cuda.current_device")
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    APPLIED.append("torch.cuda.current_device -> cpu")

    # 2. Expert and linear-layer initialisation runs under `get_cuda_rng_tracker().fork()`, which
    #    raises "cuda rng state ... is not added" without a CUDA RNG; the weights are overwritten by
    #    the tiny engine's anyway, so the fork is a null context.
    tracker_class = type(megatron_random.get_cuda_rng_tracker())
    _require(tracker_class, "fork", "the CUDA RNG tracker's fork")
    tracker_class.fork = _null_fork  # type: ignore[method-assign]
    APPLIED.append(f"{tracker_class.__name__}.fork -> nullcontext")

    # 3. `RouterGatingLinearFunction` tests `te_general_gemm is not None`, a name moe_utils binds
    #    only when Transformer Engine imports: without TE the router's forward is a NameError.
    #    None is what moe_utils means by "no TE" (its own float64 path is then used).
    gating = moe_utils.RouterGatingLinearFunction
    if "te_general_gemm" not in gating.forward.__code__.co_names:
        raise RuntimeError("cannot shim te_general_gemm: the router gating no longer reads it")
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]
    APPLIED.append("moe_utils.te_general_gemm = None")

    # 4. The token dispatcher: `alltoall` (Megatron's default) creates a CUDA stream; the
    #    config the tests build asks for `allgather`, which dispatches on the CPU. This is a
    #    configuration choice, checked here so that a renamed dispatcher fails by name.
    from megatron.core.transformer.moe import token_dispatcher

    _require(token_dispatcher, "MoEAllGatherTokenDispatcher", "the allgather token dispatcher")
    APPLIED.append("moe_token_dispatcher_type = allgather")

    # 5. Miles' `Replay.record` (miles/utils/replay_base.py) copies the replayed ids into
    #    `torch.empty_like(..., pin_memory=True)`, which raises without an accelerator. Its module
    #    sees a `torch` whose `empty_like` ignores `pin_memory`; the rest of Miles' code is unchanged.
    from miles.utils import replay_base

    _require(replay_base.Replay, "record", "Miles' Replay.record")
    if "empty_like" not in replay_base.Replay.record.__code__.co_names:
        raise RuntimeError("cannot shim Replay.record: it no longer allocates with torch.empty_like")
    replay_base.torch = torch_with(torch, empty_like=_empty_like_unpinned(torch))  # type: ignore[attr-defined]
    APPLIED.append("miles replay_base: torch.empty_like without pin_memory")
    return APPLIED


def torch_with(torch_module: Any, **overrides: Any) -> Any:
    """A stand-in for the `torch` module, for one upstream module's global: `overrides` replace
    those functions, every other name is torch's own."""
    names = {name: getattr(torch_module, name) for name in dir(torch_module) if not name.startswith("__")}
    return types.SimpleNamespace(**{**names, **overrides})


def _empty_like_unpinned(torch_module: Any) -> Any:
    """`torch.empty_like` that drops `pin_memory` (shim 5)."""

    def empty_like(tensor: Any, *args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        del pin_memory
        return torch_module.empty_like(tensor, *args, **kwargs)

    return empty_like
