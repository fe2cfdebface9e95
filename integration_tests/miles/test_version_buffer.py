"""rl360's version-aware buffer in Miles' fully-async contract, around Miles' own DefaultDataBuffer.

Loaded the way `FullyAsyncRolloutFn.__call__` loads `--custom-async-data-buffer-path` (Miles'
`load_function`, constructed with Miles' `DataBufferConstructorInput`), fed Miles'
`DataBufferInput`s of real `Sample`s; the masked samples then go through Miles'
`convert_samples_to_train_data`, whose `rollout_mask_sums` must follow the mask.
"""

from __future__ import annotations

import asyncio

from rl360_ext.sglang.versions import UNVERSIONED, VERSIONS_KEY

BUFFER = "rl360_ext.rollout.version_buffer.VersionAwareDataBuffer"
PROMPT = 3


def _versioned(make_sample, group_index, index, versions):
    sample = make_sample(
        group_index, index, float(index % 2), response_length=len(versions), prompt_length=PROMPT
    )
    n = len(sample.tokens)
    sample.metadata[VERSIONS_KEY] = {
        "token_version": [UNVERSIONED] * PROMPT + list(versions),
        "kv_version": [UNVERSIONED] * n,
        "turn_first_version": [versions[0]],
    }
    sample.weight_versions = sorted({str(v) for v in versions})
    return sample


def test_stale_groups_are_recycled_and_masked_tokens_leave_the_train_data(make_args, make_sample) -> None:
    from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data
    from miles.rollout.fully_async_data_buffer import DataBufferConstructorInput, DataBufferInput
    from miles.utils.misc import load_function

    args = make_args(
        async_data_buffer_capacity_factor=2.0,
        max_weight_staleness=None,
        n_samples_per_prompt=2,
        rl360_max_token_age=2,
        rl360_stale_group_action="requeue",
        rl360_mask_token_age=1,
    )
    recycled: list = []
    buffer = load_function(BUFFER)(DataBufferConstructorInput(args=args, unused_handler_fn=recycled.append))
    stale = [_versioned(make_sample, 0, 0, [1, 1]), _versioned(make_sample, 0, 1, [4, 4])]
    fresh = [_versioned(make_sample, 1, 2, [3, 4, 5]), _versioned(make_sample, 1, 3, [5, 5, 5])]

    async def run():
        await buffer.put(DataBufferInput(prompt_group=["stale prompts"], group=stale))
        await buffer.put(DataBufferInput(prompt_group=["fresh prompts"], group=fresh))
        return await buffer.get(current_version=5)

    entry = asyncio.run(run())
    assert entry.group is fresh and recycled == [["stale prompts"]]
    assert fresh[0].loss_mask == [0, 1, 1] and fresh[1].loss_mask == [1, 1, 1]
    metrics = buffer.get_metrics()
    assert metrics["rollout/fully_async/rl360/groups_stale_requeued"] == 1
    assert metrics["rollout/fully_async/rl360/tokens_masked"] == 1
    assert metrics["rollout/fully_async/queue_size"] == 0  # Miles' DefaultDataBuffer's own metric
    assert metrics["staleness/token_age_max"] == 1
    data = convert_samples_to_train_data(
        args,
        fresh,
        metadata={},
        custom_convert_samples_to_train_data_func=None,
        custom_reward_post_process_func=None,
    )
    assert [list(m) for m in data["loss_masks"]] == [[0, 1, 1], [1, 1, 1]]
    assert list(data["rollout_mask_sums"]) == [2, 3]  # Miles' denominators follow the mask
