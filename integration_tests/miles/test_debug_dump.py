"""`rl360 audit` reads the debug rollout dumps Miles itself writes (`--save-debug-rollout-data`).

Miles' own `save_debug_rollout_data` dumps real `Sample`s (valid ones, infra ones as rl360 marks
them, routed-expert arrays); rl360's torch-free reader must read back what Miles' own loader reads,
without falling back to torch, and the audit must count the step as the trainer saw it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


def _step(make_sample) -> list:
    samples = [make_sample(0, i, float(i % 2)) for i in range(4)]
    samples += [make_sample(1, 4, 1.0), make_sample(1, 5, 0.0)]
    samples += [make_sample(1, 6, infra="sandbox_lost"), make_sample(1, 7, infra="aborted")]
    rng = np.random.default_rng(0)
    for sample in samples:
        shape = (len(sample.tokens) - 1, 3, 2)  # [tokens - 1, layers, top_k]
        sample.rollout_routed_experts = rng.integers(0, 8, size=shape, dtype=np.int32)
    return samples


def test_rl360_reads_the_dump_miles_writes(make_args, make_sample, tmp_path: Path, monkeypatch) -> None:
    from miles.ray.rollout.debug_data import load_debug_rollout_data, save_debug_rollout_data

    from rl360_ext.rollout import audit

    def no_torch(path, error):
        raise AssertionError(f"the torch-free reader refused Miles' dump: {error}")

    monkeypatch.setattr(audit, "_torch_load", no_torch)
    template = str(tmp_path / "rollout" / "{rollout_id}.pt")
    args = make_args(save_debug_rollout_data=template, load_debug_rollout_data=template)
    args.load_debug_rollout_data_subsample = None
    samples = _step(make_sample)
    save_debug_rollout_data(
        args, samples, rollout_id=70, evaluation=False, metadata={"dynamic_global_batch_size": 8}
    )

    payload = audit.read_miles_dump(tmp_path / "rollout" / "70.pt")
    miles_samples, miles_metadata = load_debug_rollout_data(args, rollout_id=70)

    assert payload["rollout_id"] == 70
    assert payload["metadata"] == miles_metadata == {"dynamic_global_batch_size": 8}
    assert len(payload["samples"]) == len(miles_samples) == 8
    for ours, theirs in zip(payload["samples"], miles_samples, strict=True):
        assert ours["index"] == theirs.index and ours["group_index"] == theirs.group_index
        assert ours["status"] == theirs.status.value
        assert ours["reward"] == theirs.reward
        assert list(ours["loss_mask"]) == theirs.loss_mask
        assert ours["metadata"] == theirs.metadata
        np.testing.assert_array_equal(ours["rollout_routed_experts"], theirs.rollout_routed_experts)

    (step,) = audit.load_steps(tmp_path / "rollout")
    assert (step.step, step.trained, step.masked, step.contributing) == (70, 8, 2, 6)
    assert step.gradient_scale_upstream == pytest.approx(6 / 8)
    assert step.kept_mean == pytest.approx(3 / 6)
