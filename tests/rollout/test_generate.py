"""The generate hook's pure parts: flags, options, request kwargs, and filling a Sample from a merged one."""

from __future__ import annotations

import argparse
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360_ext.outcomes.provenance import is_valid
from rl360_ext.rollout import agent as agent_module
from rl360_ext.rollout.config import AgentConfig, GenerateConfig, MetricsConfig, SessionPoolConfig, env_name
from rl360_ext.rollout.generate import (
    add_arguments,
    classify,
    generate,
    load_agent_function,
    request_kwargs_from_sampling_params,
)
from rl360_ext.rollout.sample import GenerateFnInput, GenerateFnOutput, Sample
from rl360_ext.rollout.sample_fill import finish_sample, non_generation_time, session_metadata
from rl360_ext.session.samples.merge import MergedSample, TurnRecord, merge
from rl360_ext.sglang.versions import VERSIONS_KEY

LAYERS, TOP_K = 2, 3
EOS = 99


def turn(
    index: int, start: int, n_in: int, n_out: int, finish: str = "stop", rows_from: int = 0
) -> TurnRecord:
    inputs = np.arange(start, start + n_in, dtype=np.int32) + 10
    outputs = np.arange(start + n_in, start + n_in + n_out, dtype=np.int32) + 10
    end = start + n_in + n_out
    routing = (np.arange(rows_from, end - 1)[:, None, None] % 7 + np.zeros((1, LAYERS, TOP_K))).astype(
        np.uint8
    )
    return TurnRecord(
        index=index,
        segment=0,
        input_start=start,
        input_ids=inputs,
        output_ids=outputs,
        output_logprobs=-np.linspace(0.1, 0.9, n_out).astype(np.float32),
        finish_reason=finish,
        weight_version=f"{index + 3}",
        prompt_tokens=start + n_in,
        cached_tokens=start,
        routing=routing,
        routing_start=rows_from,
        routing_source=np.zeros(len(routing), np.uint8),
        routing_wire_bytes=len(routing) * 16,
        latency_s=0.25,
    )


def two_turns(second_finish: str = "stop") -> MergedSample:
    first = turn(0, 0, 5, 3)
    second = turn(1, first.end, 4, 2, second_finish, rows_from=first.end - 1)
    return merge(
        [first, second], "sid", {"session": {"routing_key": "sid", "template": {"append_only": True}}}
    )


def decode(ids: list[int]) -> str:
    """Piecewise decodes concatenate to the whole range's (Miles decodes the response turn by turn)."""
    return "".join(f"<{i}>" for i in ids)


def verifier_result(reward: float = 1.0) -> dict:
    return {
        "reward": reward,
        "rewards": {"reward": reward, "tests_passed": 3.0},
        "reward_source": "verifier",
        "failure_cause": None,
        "phase_timings": {"agent": 3.0},
        "agent_metrics": {"turns": 2},
        "exit_status": "completed",
        "attempt_class": "valid",
        "transport_error": None,
        "client_deadline": False,
    }


def finish(
    sample: Sample, merged: MergedSample | None, cls: str, result: dict | None = None, **kw: object
) -> Sample:
    return finish_sample(
        sample,
        merged=merged,
        result=result,
        attempt_class=cls,
        detail="why",
        decode=decode,
        fallback_token_id=EOS,
        routing_shape=(LAYERS, TOP_K),
        **kw,
    )


# ---- flags and options ---------------------------------------------------------------------------------


def test_one_call_registers_every_rl360_flag_and_a_second_call_is_harmless() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    add_arguments(parser)
    args = parser.parse_args(
        ["--rl360-harbor-url", "http://h:1", "--rl360-session-servers", "4", "--no-rl360-r3",
         "--rl360-agent-timeout-policy", "mask", "--rl360-metrics-path", "m.jsonl",
         "--rl360-pg-loss-constant", "8",
         "--custom-agent-function-path", "my.agent.run", "--max-seq-len", "4096"]
    )  # fmt: skip
    assert (args.rl360_harbor_url, args.rl360_session_servers, args.rl360_r3) == ("http://h:1", 4, False)
    assert (args.rl360_agent_timeout_policy, args.rl360_metrics_path, args.rl360_pg_loss_constant) == (
        "mask",
        "m.jsonl",
        8.0,
    )
    assert (args.custom_agent_function_path, args.max_seq_len) == ("my.agent.run", 4096)
    assert generate.add_arguments is add_arguments  # type: ignore[attr-defined]


def test_every_config_field_has_one_flag_whose_default_is_the_fields() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    unset = parser.parse_args([])
    for cls in (AgentConfig, SessionPoolConfig, MetricsConfig):
        for spec in dataclasses.fields(cls):
            assert getattr(unset, f"rl360_{spec.name}") is None, spec.name  # unset: the field's default
            action = parser._option_string_actions["--rl360-" + spec.name.replace("_", "-")]
            assert action.help and spec.metadata["help"] in action.help
            if spec.default not in (None, dataclasses.MISSING):
                assert f"Default: {spec.default}." in action.help
    args = parser.parse_args(
        ["--rl360-harbor-url", "http://h:1", "--rl360-model", "m", "--rl360-tokenizer", "/t",
         "--rl360-session-backend", "http://b", "--rl360-deadline-s", "12.5"]
    )  # fmt: skip
    options = GenerateConfig.from_args(args)
    assert (options.agent.model, options.agent.deadline_s, options.agent.client_margin_s) == ("m", 12.5, 5.0)


async def _forwarding_agent(
    base_url: str, prompt: object, request_kwargs: dict, metadata: dict, **kw: object
):
    return kw


async def _strict_agent(base_url: str, prompt: object, request_kwargs: dict, metadata: dict) -> dict:
    return {}


def test_agent_functions_that_take_kwargs_get_the_hooks_config() -> None:
    config = AgentConfig(harbor_url="http://h:1")
    bound = load_agent_function(None, config)
    assert bound.func is agent_module.run and bound.keywords == {"rl360_config": config}  # type: ignore[attr-defined]
    forwarding = load_agent_function(f"{__name__}._forwarding_agent", config)
    assert forwarding.keywords == {"rl360_config": config}  # type: ignore[attr-defined]
    assert load_agent_function(f"{__name__}._strict_agent", config) is _strict_agent
    assert load_agent_function(None) is agent_module.run


def test_flags_miles_already_defines_are_not_added_again() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--custom-agent-function-path", type=str)  # as agentic_tool_call.generate adds it
    parser.add_argument("--max-seq-len", type=int, dest="max_seq_len")
    add_arguments(parser)
    assert parser.parse_args(["--max-seq-len", "7"]).max_seq_len == 7
    assert parser.parse_args([]).custom_agent_function_path is None


def test_the_default_agent_function_path_lets_miles_find_the_abort_hook() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = parser.parse_args([]).custom_agent_function_path
    assert path == "rl360_ext.rollout.agent.run"
    assert load_agent_function(path.rpartition(".")[0] + ".abort") is agent_module.abort


def test_options_default_to_miles_own_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env_name("harbor_token"), raising=False)
    args = SimpleNamespace(
        rl360_harbor_url="http://h:1",
        sglang_router_ip="10.0.0.1",
        sglang_router_port=30000,
        hf_checkpoint="/models/policy",
        use_rollout_routing_replay=True,
        max_seq_len=8192,
        custom_agent_function_path=None,
    )
    options = GenerateConfig.from_args(args)
    assert options.pool.session_backend == "http://10.0.0.1:30000"
    assert (options.pool.tokenizer, options.pool.r3, options.pool.session_servers) == (
        "/models/policy",
        True,
        1,
    )
    assert (options.agent.deadline_s, options.agent.agent_timeout_policy, options.agent.task_key) == (
        3600.0,
        "score",
        "task",
    )
    assert options.agent.model == "rl360-policy" and options.max_seq_len == 8192


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [({"rl360_harbor_url": None}, "--rl360-harbor-url"),
     ({"sglang_router_ip": None}, "--rl360-session-backend"),
     ({"hf_checkpoint": None}, "--rl360-tokenizer"),
     ({"rl360_session_servers": 0}, "--rl360-session-servers"),
     ({"rl360_deadline_s": -1.0}, "--rl360-deadline-s"),
     ({"rl360_agent_timeout_policy": "drop"}, "--rl360-agent-timeout-policy")],
)  # fmt: skip
def test_missing_or_bad_options_name_the_flag(
    overrides: dict, flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_name("harbor_url"), "http://env:1")  # the hook reads its flags, not this
    base = {
        "rl360_harbor_url": "http://h:1",
        "sglang_router_ip": "10.0.0.1",
        "sglang_router_port": 30000,
        "hf_checkpoint": "/m",
    }
    with pytest.raises(ValueError, match=flag):
        GenerateConfig.from_args(SimpleNamespace(**{**base, **overrides}))


def test_sampling_params_become_openai_request_kwargs() -> None:
    kwargs = request_kwargs_from_sampling_params(
        {"max_new_tokens": 64, "sampling_seed": 7, "temperature": 0.8, "top_k": 20, "top_p": None,
         "logit_bias": {"2": 4.0}, "return_logprob": True, "min_new_tokens": 1}
    )  # fmt: skip
    assert kwargs == {
        "max_tokens": 64,
        "seed": 7,
        "temperature": 0.8,
        "top_k": 20,
        "logit_bias": {"2": 4.0},
        "min_tokens": 1,
    }
    assert request_kwargs_from_sampling_params({"max_new_tokens": 64, "max_tokens": 32}) == {"max_tokens": 32}
    assert "logit_bias" not in request_kwargs_from_sampling_params({"temperature": 1.0})


def test_the_default_agent_function_is_rl360s_and_others_load_by_dotted_path() -> None:
    assert load_agent_function(None) is agent_module.run
    assert load_agent_function("rl360_ext.rollout.agent.abort") is agent_module.abort
    with pytest.raises(ValueError, match=r"module\.function"):
        load_agent_function("run")


async def test_generate_without_a_harbor_url_fails_before_touching_anything() -> None:
    state = SimpleNamespace(
        args=SimpleNamespace(rl360_harbor_url=None, rl360_session_backend="http://b", rl360_tokenizer="/t")
    )
    with pytest.raises(ValueError, match="--rl360-harbor-url"):
        await generate(GenerateFnInput(state, Sample(metadata={"task": "t"}), {}, False))
    assert isinstance(GenerateFnOutput(samples=Sample()).samples, Sample)


# ---- filling samples ---------------------------------------------------------------------------------


def test_a_valid_attempt_fills_tokens_response_part_and_routing_like_miles() -> None:
    merged = two_turns()
    sample = finish(Sample(prompt="p", metadata={"task": "t"}), merged, "valid", verifier_result(0.0))
    prompt = merged.prompt_length
    assert sample.tokens == merged.tokens.tolist()
    assert sample.response_length == len(merged.tokens) - prompt == 3 + 4 + 2
    assert sample.loss_mask == [1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert sample.rollout_log_probs == pytest.approx(merged.rollout_log_probs[prompt:].tolist())
    assert sample.response == decode(merged.tokens[prompt:].tolist())
    assert sample.rollout_routed_experts.dtype == np.int32
    assert sample.rollout_routed_experts.shape == (len(sample.tokens) - 1, LAYERS, TOP_K)
    assert sample.weight_versions == ["3", "4"]
    assert sample.status == Sample.Status.COMPLETED
    assert (sample.reward, sample.remove_sample, is_valid(sample)) == (0.0, False, True)
    assert sample.metadata["task"] == "t" and sample.metadata["reward_source"] == "verifier"
    assert "reward" not in sample.metadata and sample.metadata["exit_status"] == "completed"
    assert (sample.metadata["cached_tokens"], sample.metadata["prompt_tokens"]) == (8, 17)
    assert sample.metadata["routing_bytes"] == 16 * (len(sample.tokens) - 1)
    sample.validate()


def test_reward_key_keeps_the_rewards_dict() -> None:
    sample = finish(Sample(), two_turns(), "valid", verifier_result(1.0), reward_key="tests_passed")
    assert sample.reward == {"reward": 1.0, "tests_passed": 3.0}


def test_an_infra_attempt_keeps_its_tokens_but_trains_on_none_of_them() -> None:
    sample = finish(Sample(), two_turns(), "infra:verifier_timeout", verifier_result(1.0))
    assert sample.loss_mask == [0] * sample.response_length and sample.response_length == 9
    assert (sample.reward, sample.remove_sample, sample.status) == (None, True, Sample.Status.ABORTED)
    assert sample.metadata["attempt_class"] == "infra:verifier_timeout"
    assert sample.metadata["infra_detail"] == "why"
    sample.validate()


def test_an_attempt_without_a_session_gets_a_masked_placeholder() -> None:
    sample = finish(Sample(prompt="p"), None, "infra:session_vanished")
    assert (sample.tokens, sample.response_length, sample.loss_mask) == ([EOS, EOS], 1, [0])
    assert sample.rollout_routed_experts.shape == (1, LAYERS, TOP_K)
    assert sample.metadata["cached_tokens"] == 0 and sample.metadata["reward_source"] is None
    sample.validate()


def test_a_valid_verdict_without_model_calls_is_aborted_not_scored() -> None:
    empty = merge([], "sid", {"session": {"routing_key": "sid"}}, routing_tail_shape=(LAYERS, TOP_K))
    sample = finish(Sample(), empty, "valid", verifier_result(1.0))
    assert (sample.metadata["attempt_class"], sample.reward) == ("infra:aborted", None)
    assert "no model calls" in sample.metadata["infra_detail"]
    sample.validate()


def test_an_engine_abort_makes_the_sample_a_prefix_so_it_is_masked() -> None:
    merged = two_turns(second_finish="abort")
    sample = finish(Sample(), merged, "valid", verifier_result(1.0))
    assert (sample.metadata["attempt_class"], sample.status, sample.reward) == (
        "infra:aborted",
        Sample.Status.ABORTED,
        None,
    )
    assert len(sample.tokens) == len(merged.tokens) and sum(sample.loss_mask) == 0
    sample.validate()


def test_max_seq_len_truncates_like_miles_session_server() -> None:
    merged = two_turns()  # turns end at 8 (5 in, 3 out) and 14 (4 in, 2 out)
    cut = finish(Sample(), merged, "valid", verifier_result(1.0), max_seq_len=13)
    assert (len(cut.tokens), cut.response_length, cut.status) == (13, 8, Sample.Status.TRUNCATED)
    assert cut.rollout_routed_experts.shape[0] == 12 and cut.weight_versions == ["3", "4"]
    cut.validate()
    # the second turn has none of its output left under 10: it is dropped, the first stays whole
    dropped = finish(Sample(), merged, "valid", verifier_result(1.0), max_seq_len=10)
    assert (len(dropped.tokens), dropped.response_length, dropped.status) == (8, 3, Sample.Status.COMPLETED)
    assert dropped.weight_versions == ["3"] and dropped.prefix_cache_info.to_dict() == {
        "cached_tokens": 0,
        "total_prompt_tokens": 5,
    }
    assert dropped.metadata["merge"]["turns_dropped_by_max_seq_len"] == 1
    assert (dropped.reward, dropped.metadata["attempt_class"]) == (1.0, "valid")
    dropped.validate()
    too_short = finish(Sample(), merged, "valid", verifier_result(1.0), max_seq_len=5)
    assert too_short.metadata["attempt_class"] == "infra:aborted"
    assert "does not fit --max-seq-len 5" in too_short.metadata["infra_detail"]


def test_non_generation_time_prefers_the_agents_tool_time() -> None:
    merged = two_turns()
    assert non_generation_time({"agent_metrics": {"total_tool_time": 4.5}}, 10.0, merged) == 4.5
    assert non_generation_time({}, 10.0, merged) == pytest.approx(9.5)
    assert non_generation_time(None, 0.1, merged) == 0.0
    assert session_metadata(None) == {"cached_tokens": 0, "prompt_tokens": 0, "routing_bytes": 0}


@st.composite
def merged_samples(draw: st.DrawFn) -> MergedSample:
    turns, position, rows = [], 0, 0
    for index in range(draw(st.integers(0, 5))):
        n_in, n_out = draw(st.integers(1, 5)), draw(st.integers(0, 5))
        finish_reason = draw(st.sampled_from(["stop", "stop", "length", "abort"]))
        record = turn(index, position, n_in, n_out, finish_reason, rows_from=rows)
        turns.append(record)
        position, rows = record.end, record.end - 1
        if finish_reason != "stop":
            break
    return merge(turns, "sid", {"session": {"routing_key": "sid"}}, routing_tail_shape=(LAYERS, TOP_K))


@settings(max_examples=150, deadline=None)
@given(
    merged=st.one_of(st.none(), merged_samples()),
    cls=st.sampled_from(["valid", "infra:transport_error", "infra:session_vanished", "infra:verifier_crash"]),
    max_seq_len=st.one_of(st.none(), st.integers(1, 40)),
)
def test_every_filled_sample_is_consistent_and_only_valid_ones_train(
    merged: MergedSample | None, cls: str, max_seq_len: int | None
) -> None:
    sample = finish(Sample(), merged, cls, verifier_result(0.5), max_seq_len=max_seq_len)
    sample.validate()
    assert sample.rollout_routed_experts.shape == (len(sample.tokens) - 1, LAYERS, TOP_K)
    if is_valid(sample):
        assert cls == "valid" and sample.reward == 0.5 and not sample.remove_sample
        assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        assert sum(sample.loss_mask) > 0 or sample.response_length > 0
    else:
        assert sample.reward is None and sample.remove_sample and sample.status == Sample.Status.ABORTED
        assert sum(sample.loss_mask) == 0 and sample.response_length >= 1


# ---- engine failures the agent carried on past ----------------------------------------------------


def with_turn_errors(errors: list[dict]) -> MergedSample:
    first = turn(0, 0, 5, 3)
    facts = {"routing_key": "sid", "template": {"append_only": True}, "turn_errors": errors}
    return merge([first], "sid", {"session": facts})


def test_a_failed_engine_turn_masks_a_graded_attempt() -> None:
    merged = with_turn_errors([{"turn": 1, "status": 502, "cause": "engine_failed"}])
    assert classify(verifier_result(1.0), None, "score", merged) == "infra:no_engine_available"


def test_client_errors_and_clean_sessions_keep_the_verifier_reward() -> None:
    rejected = with_turn_errors([{"turn": 1, "status": 400, "cause": "engine_rejected"}])
    assert classify(verifier_result(0.0), None, "score", rejected) == "valid"
    assert classify(verifier_result(0.0), None, "score", with_turn_errors([])) == "valid"
    assert classify(verifier_result(0.0), None, "score", None) == "valid"


def test_the_session_measured_model_time_joins_the_attempts_phase_timings() -> None:
    sample = finish(Sample(), two_turns(), "valid", verifier_result())
    assert sample.metadata["phase_timings"] == {"agent": 3.0, "model": 0.5}  # two turns of 0.25 s
    assert finish(Sample(), None, "infra:session_vanished", verifier_result()).metadata["phase_timings"] == {
        "agent": 3.0
    }


def test_template_drift_mask_zeroes_the_loss_mask_only_when_asked() -> None:
    from types import SimpleNamespace

    from rl360_ext.rollout.config import GenerateConfig
    from rl360_ext.rollout.sample_fill import mask_template_drift

    def sample(mismatch: bool) -> SimpleNamespace:
        return SimpleNamespace(
            loss_mask=[1, 0, 1], metadata={"template_drift": {"checked": True, "mismatch": mismatch}}
        )

    drifting = sample(True)
    assert not mask_template_drift(drifting, "keep") and drifting.loss_mask == [1, 0, 1]
    assert mask_template_drift(drifting, "mask") and drifting.loss_mask == [0, 0, 0]
    assert drifting.metadata["template_drift_masked"] is True
    clean = sample(False)
    assert not mask_template_drift(clean, "mask") and clean.loss_mask == [1, 0, 1]
    with pytest.raises(ValueError, match="--rl360-on-template-drift"):
        GenerateConfig.from_args(
            SimpleNamespace(
                rl360_harbor_url="http://h",
                rl360_session_backend="http://b",
                rl360_tokenizer="/t",
                rl360_on_template_drift="drop",
            )
        )


def test_the_rollout_sample_carries_every_span_and_the_version_arrays() -> None:
    first = turn(0, 0, 5, 3)
    first.weight_versions = [{"version": "3", "start": 0, "end": 1}, {"version": "4", "start": 1, "end": 3}]
    second = turn(1, first.end, 4, 2, rows_from=first.end - 1)
    merged = merge([first, second], "sid", {"session": {"routing_key": "sid"}})
    sample = finish(Sample(prompt="p", metadata={"task": "t"}), merged, "valid", verifier_result())
    assert sample.weight_versions == ["3", "4", "4"]  # every span of every turn, in order
    assert min(int(v) for v in sample.weight_versions) == 3  # Miles' Sample.oldest_weight_version
    arrays = sample.metadata[VERSIONS_KEY]
    assert arrays["token_version"] == [-1] * 5 + [3, 4, 4] + [-1] * 4 + [4, 4]
    assert len(arrays["routing_source"]) == len(arrays["routing_version"]) == len(sample.tokens) - 1
    assert arrays["turn_first_version"] == [3, 4]


# ---- evaluation ------------------------------------------------------------------------------------


def test_an_eval_attempt_carries_no_routing_rows_and_says_it_is_an_eval() -> None:
    sample = finish(
        Sample(metadata={"task": "t"}), two_turns(), "valid", verifier_result(1.0), evaluation=True
    )
    assert sample.rollout_routed_experts is None and sample.metadata["evaluation"] is True
    assert (sample.reward, is_valid(sample)) == (1.0, True)
    sample.validate()
    trained = finish(Sample(metadata={"task": "t"}), two_turns(), "valid", verifier_result(1.0))
    assert trained.rollout_routed_experts is not None and "evaluation" not in trained.metadata


def test_an_eval_infra_attempt_under_a_reward_key_reads_none_where_miles_indexes_it() -> None:
    sample = finish(
        Sample(),
        two_turns(),
        "infra:sandbox_lost",
        verifier_result(1.0),
        reward_key="tests_passed",
        evaluation=True,
    )
    assert sample.reward == {"tests_passed": None} and not is_valid(sample)
    assert sample.reward["tests_passed"] is None  # Miles: sample.reward[reward_key] for every eval sample
    assert sample.rollout_routed_experts is None
    sample.validate()
    plain = finish(Sample(), None, "infra:sandbox_lost", evaluation=True)
    assert plain.reward is None and plain.status == Sample.Status.ABORTED


def test_eval_reads_the_eval_reward_key_before_the_reward_key() -> None:
    from rl360_ext.rollout.generate import eval_reward_key

    assert eval_reward_key(SimpleNamespace(eval_reward_key="acc", reward_key="score")) == "acc"
    assert eval_reward_key(SimpleNamespace(eval_reward_key=None, reward_key="score")) == "score"
    assert eval_reward_key(SimpleNamespace()) is None


class _EvalPool:
    """The SessionPool calls the hook makes, in process; records how sessions were opened."""

    def __init__(self, merged: MergedSample) -> None:
        self.urls = ["http://session.invalid"]
        self.merged = merged
        self.opened: list[bool | None] = []

    async def acreate_session(
        self, metadata: dict | None = None, routing_key: str | None = None, r3: bool | None = None
    ) -> tuple[str, str]:
        self.opened.append(r3)
        return f"session-{len(self.opened):012d}", f"{self.urls[0]}/sessions/s/v1"

    def server_for(self, session_id: str) -> int:
        return 0

    async def acollect(self, session_ids: list[str]) -> list[MergedSample]:
        return [self.merged for _ in session_ids]

    async def adelete(self, session_id: str) -> None:
        return None


SEEN_AGENT_CALLS: list[dict] = []


async def graded_agent(
    base_url: str, prompt: object, request_kwargs: dict, metadata: dict, **_: object
) -> dict:
    SEEN_AGENT_CALLS.append({"request_kwargs": request_kwargs, "metadata": metadata})
    return verifier_result(1.0)


@pytest.mark.parametrize("evaluation", [False, True])
async def test_generate_opens_eval_sessions_without_r3_and_never_masks_their_loss(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, evaluation: bool
) -> None:
    import concurrent.futures

    from rl360_ext.rollout import generate as generate_module
    from rl360_ext.templates.drift import DRIFT_KEY

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--rl360-harbor-url", "http://harbor.invalid", "--rl360-session-backend", "http://engine.invalid",
            "--rl360-tokenizer", str(tmp_path), "--rl360-r3", "--rl360-on-template-drift", "mask",
            "--custom-agent-function-path", f"{__name__}.graded_agent",
        ]
    )  # fmt: skip
    args.reward_key = None
    merged = two_turns()
    merged.metadata[DRIFT_KEY] = {"checked": True, "mismatch": True}
    pool = _EvalPool(merged)
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(generate_module.PoolHandle(pool, ["instance"], (LAYERS, TOP_K)))
    monkeypatch.setitem(generate_module._pools, GenerateConfig.from_args(args).pool, future)
    monkeypatch.setattr(
        generate_module, "_tokenizer", lambda _: SimpleNamespace(decode=decode, eos_token_id=EOS)
    )
    SEEN_AGENT_CALLS.clear()
    state = SimpleNamespace(args=args)
    params = {"temperature": 0.0, "max_new_tokens": 8}
    out = await generate(GenerateFnInput(state, Sample(metadata={"task": "t"}), params, evaluation))
    sample = out.samples
    assert pool.opened == [False if evaluation else None]
    assert SEEN_AGENT_CALLS[0]["request_kwargs"] == {"temperature": 0.0, "max_tokens": 8}
    assert SEEN_AGENT_CALLS[0]["metadata"].get("evaluation") is (True if evaluation else None)
    assert is_valid(sample) and sample.reward == 1.0
    if evaluation:  # an eval sample is never trained: drift leaves its loss mask alone, no R3 rows
        assert sample.rollout_routed_experts is None and any(sample.loss_mask)
        assert "template_drift_masked" not in sample.metadata
    else:
        assert sample.rollout_routed_experts is not None and not any(sample.loss_mask)
