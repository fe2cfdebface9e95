"""Miles' rollout data types, or stand-ins with the same names and fields when Miles is absent.

Owns one import point for `Sample`, `GenerateFnInput` and `GenerateFnOutput`. When Miles is
importable (radixark/miles: `miles.utils.types.Sample`, `miles.rollout.base_types`), these ARE
Miles' classes, so the generate hook hands Miles exactly the objects it expects. Otherwise (unit
tests, demos, machines without torch) they are small dataclasses with the fields and names rl360
reads and writes; they do not reproduce Miles' behaviour beyond that (no multimodal handling,
no speculative-decoding bookkeeping).
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

try:
    from miles.rollout.base_types import GenerateFnInput, GenerateFnOutput
    from miles.utils.types import Sample

    MILES_TYPES = True
except ImportError:
    MILES_TYPES = False

    @dataclass
    class Sample:  # type: ignore[no-redef]
        """The Sample fields rl360 uses, named as in `miles.utils.types.Sample`."""

        class Status(Enum):
            PENDING = "pending"
            COMPLETED = "completed"
            TRUNCATED = "truncated"
            ABORTED = "aborted"
            FAILED = "failed"

        @dataclass
        class PrefixCacheInfo:
            """Same fields and dict form as `miles.utils.types.Sample.PrefixCacheInfo`."""

            cached_tokens: int = 0
            total_prompt_tokens: int = 0

            def to_dict(self) -> dict[str, int]:
                return {"cached_tokens": self.cached_tokens, "total_prompt_tokens": self.total_prompt_tokens}

            @staticmethod
            def from_dict(data: dict[str, Any]) -> Sample.PrefixCacheInfo:
                return Sample.PrefixCacheInfo(
                    int(data.get("cached_tokens", 0)), int(data.get("total_prompt_tokens", 0))
                )

        group_index: int | None = None
        index: int | None = None
        rollout_id: int | None = None
        prompt: str | list[dict[str, Any]] = ""
        tokens: list[int] = field(default_factory=list)
        response: str = ""
        response_length: int = 0
        label: str | None = None
        reward: float | dict[str, Any] | None = None
        loss_mask: list[int] | None = None
        weight_versions: list[str] = field(default_factory=list)
        rollout_log_probs: list[float] | None = None
        rollout_routed_experts: Any = None  # np.int32 [len(tokens) - 1, layers, top_k]
        remove_sample: bool = False
        status: Status = Status.PENDING
        metadata: dict = field(default_factory=dict)
        generate_function_path: str | None = None
        train_metadata: dict | None = None
        routing_key: str | None = None
        non_generation_time: float = 0.0
        prefix_cache_info: PrefixCacheInfo = field(default_factory=lambda: Sample.PrefixCacheInfo())

        def to_dict(self) -> dict[str, Any]:
            value = self.__dict__.copy()
            value["status"] = self.status.value
            value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
            return value

        def validate(self) -> None:
            """The length invariants Miles' `Sample.validate` checks, as ValueErrors."""
            if self.response_length < 0 or len(self.tokens) < self.response_length:
                raise ValueError(
                    f"response_length {self.response_length} must be in [0, len(tokens)={len(self.tokens)}]"
                )
            for name in ("loss_mask", "rollout_log_probs"):
                value = getattr(self, name)
                if value is not None and len(value) != self.response_length:
                    raise ValueError(f"{name} length {len(value)} != response_length {self.response_length}")
            routed = self.rollout_routed_experts
            if routed is not None and len(routed) != len(self.tokens) - 1:
                raise ValueError(
                    f"rollout_routed_experts length {len(routed)} != len(tokens) - 1 ({len(self.tokens) - 1})"
                )

    @dataclass(frozen=True)
    class GenerateFnInput:  # type: ignore[no-redef]
        """Same fields as `miles.rollout.base_types.GenerateFnInput`; `state` needs an `args`."""

        state: Any
        sample: Sample
        sampling_params: dict[str, Any]
        evaluation: bool

        @property
        def args(self) -> Namespace:
            return self.state.args

    @dataclass(frozen=True)
    class GenerateFnOutput:  # type: ignore[no-redef]
        """Same field as `miles.rollout.base_types.GenerateFnOutput`."""

        samples: Sample | list[Sample]


__all__ = ["MILES_TYPES", "GenerateFnInput", "GenerateFnOutput", "Sample"]
