"""The audit: the field's step 70 (56 kept, 23 masked, kept mean 0.75) reports x0.59 and +0.31."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rl360_ext.rollout.audit import (
    AuditAttempt,
    UnsupportedDumpError,
    audit_step,
    format_step,
    load_steps,
    main,
    read_miles_dump,
)
from rl360_ext.rollout.metrics import REGISTRY, log_rollout_metrics

MASKED_PER_GROUP = [3, 3, 3, 3, 3, 4, 4]  # 23 of 7 x 8 = 56


def field_step(rl360_metadata: bool) -> list[dict[str, Any]]:
    """Sample.to_dict()-shaped rows: 33 valid rewards summing to 24.75 (mean 0.75), 23 masked failures."""
    rewards = iter([1.0] * 24 + [0.75] + [0.0] * 8)
    rows, index = [], 0
    for group, masked in enumerate(MASKED_PER_GROUP):
        for slot in range(8):
            is_masked = slot < masked
            if rl360_metadata:
                metadata = (
                    {"attempt_class": "infra:client_deadline"} if is_masked else {"reward_source": "verifier"}
                )
                reward = None if is_masked else next(rewards)
            else:
                metadata, reward = {}, 0.0 if is_masked else next(rewards)
            rows.append(
                {
                    "group_index": group,
                    "index": index,
                    "tokens": [1, 2, 3, 4],
                    "response_length": 2,
                    "reward": reward,
                    "loss_mask": [0, 0] if is_masked else [1, 1],
                    "remove_sample": is_masked and rl360_metadata,
                    "status": "completed",
                    "metadata": metadata,
                    "rollout_routed_experts": np.zeros((3, 2, 2), dtype=np.int32),
                    "spec_info": {},
                    "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
                }
            )
            index += 1
    return rows


def write_dump(path: Path, data_pkl: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """The zip layout torch.save writes: <prefix>/data.pkl, <prefix>/data/<key>, byteorder, version."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
        for key, raw in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", raw)
    return path


def write_miles_dump(path: Path, rollout_id: int, samples: list[dict[str, Any]]) -> Path:
    return write_dump(
        path, pickle.dumps({"rollout_id": rollout_id, "metadata": {}, "samples": samples}, protocol=2)
    )


def test_field_step_from_samples_reports_x059_and_plus031() -> None:
    attempts = [
        AuditAttempt(
            group=row["group_index"],
            valid=row["reward"] is not None,
            masked=row["reward"] is None,
            reward=row["reward"],
        )
        for row in field_step(rl360_metadata=True)
    ]
    audit = audit_step(attempts, step=70)
    assert (audit.trained, audit.masked, audit.contributing) == (56, 23, 33)
    assert audit.kept_mean == pytest.approx(0.75)
    assert (
        audit.baseline_whole_batch == pytest.approx(24.75 / 56)
        and round(audit.baseline_whole_batch, 2) == 0.44
    )
    assert audit.gradient_scale_upstream == pytest.approx(33 / 56)
    assert audit.advantage_shift_whole_batch == pytest.approx(0.75 - 24.75 / 56)
    assert audit.logged_mean_bias == pytest.approx(24.75 / 56 - 0.75)
    line = format_step(audit)
    assert "x0.59" in line and "+0.31" in line and "bias -0.31" in line


@pytest.mark.parametrize("rl360_metadata", [True, False], ids=["rl360-dump", "upstream-dump"])
def test_miles_dump_is_read_without_torch(
    tmp_path: Path, rl360_metadata: bool, capsys: pytest.CaptureFixture
) -> None:
    path = write_miles_dump(tmp_path / "70.pt", 70, field_step(rl360_metadata))
    payload = read_miles_dump(path)
    assert payload["rollout_id"] == 70 and payload["samples"][0]["rollout_routed_experts"].shape == (3, 2, 2)
    main(path, as_json=False)
    out = capsys.readouterr().out
    assert "step 70 (miles_dump): 56 trained, 23 masked" in out and "x0.59" in out and "+0.31" in out
    main(path, as_json=True)
    (record,) = json.loads(capsys.readouterr().out)
    assert record["gradient_scale_upstream"] == pytest.approx(33 / 56)
    assert record["advantage_shift_whole_batch"] == pytest.approx(0.3080357)
    # per-group masked-as-zero baselines (Miles with group_index but failures scored 0) shift less
    assert 0 < record["advantage_shift_group_masked_zero"] < record["advantage_shift_whole_batch"]


def test_rl360_jsonl_is_audited_per_step(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.rollout.duck_samples import infra, valid

    REGISTRY.drain()
    path = tmp_path / "metrics.jsonl"
    args = SimpleNamespace(reward_key=None, dynamic_sampling_filter_path=None, rl360_metrics_path=path)
    for step in (69, 70):
        samples, rows = [], field_step(rl360_metadata=True)
        for row in rows:
            if row["reward"] is None:
                samples.append(infra(row["group_index"], row["index"], "client_deadline"))
            else:
                samples.append(valid(row["group_index"], row["index"], row["reward"]))
        log_rollout_metrics(step, args, samples, {}, 10.0)
    audits = load_steps(path)
    assert [a.step for a in audits] == [69, 70]
    assert audits[1].source == "rl360_jsonl" and audits[1].unfiltered_mean == pytest.approx(0.75)
    main(path, as_json=False)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("x0.59" in line and "+0.31" in line for line in lines)


def test_folder_of_dumps_in_step_order(tmp_path: Path) -> None:
    write_miles_dump(tmp_path / "10.pt", 10, field_step(False))
    write_miles_dump(tmp_path / "3.pt", 3, field_step(False)[:8])
    write_miles_dump(tmp_path / "eval_3.pt", 3, [])
    assert [a.step for a in load_steps(tmp_path)] == [3, 10]


def _binunicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def test_tensor_storages_become_numpy_arrays(tmp_path: Path) -> None:
    """Hand-assembled torch pickle: {"t": _rebuild_tensor_v2(FloatStorage '0', 0, (3, 2), (1, 3))}."""
    tensor = (
        b"ctorch._utils\n_rebuild_tensor_v2\n("
        + b"("
        + _binunicode("storage")
        + b"ctorch\nFloatStorage\n"
        + _binunicode("0")
        + _binunicode("cpu")
        + b"K\x06tQ"
        + b"K\x00(K\x03K\x02t(K\x01K\x03t\x89ccollections\nOrderedDict\n)Rt"
        + b"R"
    )
    data = b"\x80\x02}" + _binunicode("t") + tensor + b"s."
    storage = np.arange(6, dtype="<f4").tobytes()
    payload = read_miles_dump(write_dump(tmp_path / "t.pt", data, {"0": storage}))
    assert payload["t"].dtype == np.float32
    np.testing.assert_array_equal(payload["t"], np.arange(6, dtype=np.float32).reshape(2, 3).T)


def test_miles_objects_become_records(tmp_path: Path) -> None:
    data = (
        b"\x80\x02}"
        + _binunicode("adapter")
        + b"cmiles.utils.types\nAdapterRef\n)\x81}("
        + _binunicode("name")
        + _binunicode("a")
        + _binunicode("slot")
        + b"K\x02ubs."
    )
    payload = read_miles_dump(write_dump(tmp_path / "a.pt", data))
    assert payload["adapter"] == {"name": "a", "slot": 2}


def test_foreign_globals_are_refused_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = b"\x80\x02cos\nsystem\n" + _binunicode(f"touch {marker}") + b"\x85R."
    path = write_dump(tmp_path / "bad.pt", data)
    with pytest.raises(UnsupportedDumpError, match=r"os\.system"):
        read_miles_dump(path)
    assert not marker.exists()


def test_inputs_that_are_not_dumps(tmp_path: Path) -> None:
    (tmp_path / "x.pt").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"torch\.save zip"):
        load_steps(tmp_path / "x.pt")
    with pytest.raises(FileNotFoundError):
        load_steps(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no Miles rollout dumps"):
        load_steps(empty)
    data = io.BytesIO()
    pickle.dump([1, 2], data, protocol=2)
    with pytest.raises(ValueError, match="expected a dict"):
        read_miles_dump(write_dump(tmp_path / "list.pt", data.getvalue()))
