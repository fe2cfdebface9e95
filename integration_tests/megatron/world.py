"""The single-process world Megatron and Miles need on a CPU, shared by conftest.py and bench.py.

Owns `single_rank_world`: the CPU shims applied (cpu_shims.py), a gloo process group on a
FileStore (no port), Megatron's model-parallel state with every size 1, and Miles'
single-process ParallelState (its tp group Megatron's, as Miles' Megatron actor sets it: the
vocab-parallel cross-entropy reads it); and `causal_mask`, the attention mask passed in so that
no CUDA default is built. Needs torch, Megatron and Miles importable (the scratch venv).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def single_rank_world(store_dir: Path) -> Iterator[list[str]]:
    """Shims applied, a one-rank gloo group, Megatron's and Miles' parallel state; yields the shims."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from miles.backends.training_utils.parallel import GroupInfo, ParallelState, set_parallel_state

    from integration_tests.megatron.cpu_shims import apply_cpu_shims

    shims = apply_cpu_shims()
    store = dist.FileStore(str(store_dir / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    trivial = GroupInfo(rank=0, size=1, group=None)
    tp = GroupInfo(
        rank=0, size=1, group=parallel_state.get_tensor_model_parallel_group()
    )  # vocab-parallel CE
    set_parallel_state(
        ParallelState(
            intra_dp=trivial,
            intra_dp_cp=trivial,
            cp=trivial,
            tp=tp,
            pp=trivial,
            ep=trivial,
            etp=trivial,
            indep_dp=trivial,
            is_pp_last_stage=True,
        )
    )
    try:
        yield shims
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def causal_mask(n: int) -> Any:
    """Megatron's [1, 1, n, n] attention mask (True = masked), passed in so no CUDA default is built."""
    import torch

    return torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)[None, None]
