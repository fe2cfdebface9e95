"""Starting a local Ray: a node that timed out during startup is started again, nothing else is."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from rl360_ext.local import local_ray
from rl360_ext.local.local_ray import START_ATTEMPTS, init_local_ray

TIMED_OUT = "The current node timed out during startup. This could happen because some of the raylet failed"


class FakeRay:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[dict[str, Any]] = []
        self.shutdowns = 0

    def init(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        if self.failures:
            raise self.failures.pop(0)
        return "context"

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(failures: list[Exception]) -> FakeRay:
        fake_ray = FakeRay(failures)
        monkeypatch.setattr(ray, "init", fake_ray.init)
        monkeypatch.setattr(ray, "shutdown", fake_ray.shutdown)
        return fake_ray

    return install


def test_a_node_that_timed_out_is_started_again(fake: Any) -> None:
    fake_ray = fake([Exception(TIMED_OUT)])
    assert init_local_ray(num_cpus=2) == "context"
    assert fake_ray.calls == [{"address": "local", "num_cpus": 2}] * 2 and fake_ray.shutdowns == 1


def test_it_gives_up_after_the_last_attempt(fake: Any) -> None:
    fake_ray = fake([Exception(TIMED_OUT)] * START_ATTEMPTS)
    with pytest.raises(Exception, match="timed out during startup"):
        init_local_ray()
    assert len(fake_ray.calls) == START_ATTEMPTS


def test_any_other_error_is_raised_at_once(fake: Any) -> None:
    fake_ray = fake([ValueError("num_cpus must be >= 0")])
    with pytest.raises(ValueError, match="num_cpus"):
        init_local_ray(num_cpus=-1)
    assert len(fake_ray.calls) == 1 and fake_ray.shutdowns == 0 and local_ray.START_ATTEMPTS >= 2
