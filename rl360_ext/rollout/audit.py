"""Rollout audit: what upstream defaults would have done to a step, against rl360's hooks.

Owns `rl360 audit PATH [--json]` (wired by the lead to `main`), the per-step arithmetic
(`audit_step`) that the rollout metrics hook also logs live, and a torch-free reader for Miles'
debug rollout dumps (`--save-debug-rollout-data`: `torch.save(dict(rollout_id, metadata,
samples=[Sample.to_dict()...]))`, a zip with a pickle inside). It reads; it never trains or
rewrites anything.

Per step, over the samples that reached the trainer:
- gradient scale: Miles divides the summed per-sample losses by the number of samples (or
  rollouts) in the step, masked ones included, so each gradient is scaled by
  contributing/trained (the field's x0.59 with 23 of 56 masked).
- advantage shift: mean over contributing samples of (upstream advantage - rl360 advantage),
  before std normalization, for a whole-batch baseline and for per-group baselines that count
  masked samples with their recorded reward (0 when none). rl360's baseline is the mean over the
  group's valid samples (0 advantage for a group with fewer than two).
- logged-mean bias: the batch mean upstream logs (failures counted with reward 0) minus the mean
  over valid samples.

The step gate: a JSONL with `"kind": "gate"` lines (`rl360_ext.gate.rules.GateVerdict.record`, written
by the Miles hook `rl360_ext.gate.miles_hook` and by `rl360 demo`) adds each step's verdict (train,
skip, stop) and the rules that fired, with value and bound, to its audit (`StepAudit.gate`), and a
closing line sums them over the run (`gate_summary`). This module reads those lines as JSON only (the
gate package sits above it).

Validity: samples carrying rl360 provenance metadata are judged by
`rl360_ext.outcomes.provenance`. Dumps from runs without rl360 carry none; there a sample whose
loss mask is all zero (or `remove_sample`) is counted masked and every other sample valid, which
is what the trainer saw.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import pickle
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl360_ext.errors import Rl360Error
from rl360_ext.outcomes.provenance import ATTEMPT_CLASS, REWARD_SOURCE, is_valid


@dataclass(frozen=True)
class AuditAttempt:
    """One trained sample as the audit sees it."""

    group: Any  # group_index, None when unknown
    valid: bool  # its reward counts
    masked: bool  # its loss mask is all zero in the trained batch
    reward: float | None  # recorded reward, None when absent


@dataclass
class StepAudit:
    step: int | None
    source: str
    trained: int
    masked: int
    contributing: int
    kept_mean: float | None
    gradient_scale_upstream: float | None
    baseline_whole_batch: float | None
    advantage_shift_whole_batch: float | None
    advantage_shift_group_masked_zero: float | None
    logged_mean_upstream: float | None
    logged_mean_bias: float | None
    unfiltered_mean: float | None = None
    filter_bias: float | None = None
    note: str = ""
    gate: dict[str, Any] | None = None  # the step gate's verdict: {"action", "reasons": [...]}, or None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _upstream_reward(attempt: AuditAttempt) -> float:
    return attempt.reward if attempt.reward is not None else 0.0


def audit_step(
    attempts: Sequence[AuditAttempt],
    *,
    step: int | None = None,
    source: str = "samples",
    unfiltered_mean: float | None = None,
) -> StepAudit:
    """The audit of one step from the samples that reached the trainer."""
    trained = len(attempts)
    masked = sum(a.masked for a in attempts)
    valid = [a for a in attempts if a.valid]
    contributing = [a for a in valid if not a.masked]
    kept_mean = _mean([a.reward for a in valid])
    upstream_mean = _mean([_upstream_reward(a) for a in attempts])
    shift_whole = shift_group = None
    note = ""
    if contributing and all(a.group is not None for a in attempts):
        ours = _rl360_advantages(attempts)
        group_baselines = _group_means(attempts, _upstream_reward, lambda a: True)
        shift_whole = _mean([(a.reward - upstream_mean) - ours[id(a)] for a in contributing])
        shift_group = _mean([(a.reward - group_baselines[a.group]) - ours[id(a)] for a in contributing])
    elif contributing:
        note = "samples lack group_index: rl360 would refuse this batch; advantage shifts not computed"
    return StepAudit(
        step=step,
        source=source,
        trained=trained,
        masked=masked,
        contributing=len(contributing),
        kept_mean=kept_mean,
        gradient_scale_upstream=len(contributing) / trained if trained else None,
        baseline_whole_batch=upstream_mean,
        advantage_shift_whole_batch=shift_whole,
        advantage_shift_group_masked_zero=shift_group,
        logged_mean_upstream=upstream_mean,
        logged_mean_bias=None if upstream_mean is None or kept_mean is None else upstream_mean - kept_mean,
        unfiltered_mean=unfiltered_mean,
        filter_bias=None if unfiltered_mean is None or kept_mean is None else kept_mean - unfiltered_mean,
        note=note,
    )


def _group_means(attempts: Sequence[AuditAttempt], value: Any, include: Any) -> dict[Any, float]:
    sums: dict[Any, list[float]] = {}
    for a in attempts:
        if include(a):
            sums.setdefault(a.group, []).append(value(a))
    return {group: sum(values) / len(values) for group, values in sums.items()}


def _rl360_advantages(attempts: Sequence[AuditAttempt]) -> dict[int, float]:
    """rl360's advantage (before std normalization) of each valid attempt, keyed by id()."""
    counts: dict[Any, int] = {}
    for a in attempts:
        if a.valid:
            counts[a.group] = counts.get(a.group, 0) + 1
    baselines = _group_means(attempts, lambda a: a.reward, lambda a: a.valid)
    return {
        id(a): (a.reward - baselines[a.group] if counts[a.group] >= 2 else 0.0) for a in attempts if a.valid
    }


# ---- inputs -------------------------------------------------------------------------------


def load_steps(path: Path) -> list[StepAudit]:
    """Audits for every step in `path`: a Miles dump (.pt), an rl360 metrics JSONL, or a folder of them."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    if path.is_dir():
        files = sorted(
            (p for p in path.iterdir() if p.suffix in (".pt", ".jsonl") and not p.name.startswith("eval_")),
            key=_step_sort_key,
        )
        if not files:
            raise ValueError(f"{path} holds no Miles rollout dumps (*.pt) or rl360 metrics (*.jsonl)")
        return [audit for file in files for audit in load_steps(file)]
    if path.suffix == ".jsonl":
        return _audits_from_jsonl(path)
    return [_audit_from_dump(path)]


def _step_sort_key(path: Path) -> tuple[int, str]:
    match = re.search(r"(\d+)$", path.stem)
    return (int(match.group(1)) if match else -1, path.name)


def _audits_from_jsonl(path: Path) -> list[StepAudit]:
    attempts: dict[Any, list[AuditAttempt]] = {}
    unfiltered: dict[Any, float | None] = {}
    gates: dict[Any, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from error
        step = record.get("rollout_id")
        if record.get("kind") == "step":
            unfiltered[step] = (record.get("metrics") or {}).get("reward/unfiltered_mean")
            attempts.setdefault(step, [])
        elif record.get("kind") == GATE_KIND:
            gates[step] = _gate_verdict(record, f"{path}:{number}")
        elif record.get("kind") == "attempt" and record.get("trained"):
            valid = record.get("attempt_class") == "valid"
            attempts.setdefault(step, []).append(
                AuditAttempt(
                    group=record.get("group_index"),
                    valid=valid,
                    masked=not valid,
                    reward=record.get("reward"),
                )
            )
    if not attempts:
        raise ValueError(f"{path} has no rl360 step or attempt records")
    audits = [
        audit_step(items, step=step, source="rl360_jsonl", unfiltered_mean=unfiltered.get(step))
        for step, items in sorted(attempts.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    ]
    for audit in audits:
        audit.gate = gates.get(audit.step)
    return audits


GATE_KIND = "gate"  # the step gate's JSONL line (`rl360_ext.gate.rules.GateVerdict.record` writes it)
GATE_ACTIONS = ("train", "skip", "stop")


def _gate_verdict(record: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A gate line's verdict and reasons; a ValueError names the line and the field that is wrong."""
    action = record.get("action")
    if action not in GATE_ACTIONS:
        names = ", ".join(GATE_ACTIONS)
        raise ValueError(f"{where}: gate line: action must be one of {names}, got {action!r}")
    reasons = record.get("reasons") or []
    if not isinstance(reasons, list) or not all(isinstance(r, Mapping) for r in reasons):
        raise ValueError(f"{where}: gate line: reasons must be a list of objects, got {reasons!r}")
    return {"action": action, "reasons": [dict(r) for r in reasons]}


def _gate_reason(reason: Mapping[str, Any]) -> str:
    def num(value: Any) -> str:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return format(value, ".4g") if number else "n/a"

    hard = "hard, " if reason.get("hard") else ""
    return (
        f"{reason.get('rule')} ({hard}{reason.get('metric')} = {num(reason.get('value'))} "
        f"{reason.get('op')} {num(reason.get('bound'))})"
    )


def gate_summary(audits: Sequence[StepAudit]) -> str | None:
    """One line over the run's gate verdicts: counts by action and the steps each rule fired on
    (None: no step has a gate line)."""
    judged = [(a.step, a.gate) for a in audits if a.gate is not None]
    if not judged:
        return None
    counts = {action: sum(gate["action"] == action for _, gate in judged) for action in GATE_ACTIONS}
    fired: dict[str, list[str]] = {}
    for step, gate in judged:
        for reason in gate["reasons"]:
            fired.setdefault(str(reason.get("rule")), []).append(str(step))
    text = f"gate: {len(judged)} steps judged: " + ", ".join(f"{counts[a]} {a}" for a in GATE_ACTIONS)
    if fired:
        steps = (f"{rule} at step(s) {', '.join(at)}" for rule, at in sorted(fired.items()))
        text += "; fired: " + ", ".join(steps)
    return text


def _audit_from_dump(path: Path) -> StepAudit:
    payload = read_miles_dump(path)
    samples = payload.get("samples")
    if not isinstance(samples, list):
        raise ValueError(f"{path}: not a Miles rollout dump (no 'samples' list)")
    step = payload.get("rollout_id")
    return audit_step([dump_attempt(s) for s in samples], step=step, source="miles_dump")


def dump_attempt(sample: Mapping[str, Any]) -> AuditAttempt:
    """An `AuditAttempt` from one `Sample.to_dict()` of a Miles dump."""
    metadata = sample.get("metadata") or {}
    mask = sample.get("loss_mask")
    mask_zero = bool(sample.get("remove_sample")) or (mask is not None and not any(int(m) for m in mask))
    if isinstance(metadata, Mapping) and (ATTEMPT_CLASS in metadata or REWARD_SOURCE in metadata):
        valid = is_valid(sample)
        masked = mask_zero or not valid
    else:
        valid, masked = not mask_zero, mask_zero
    return AuditAttempt(
        group=sample.get("group_index"), valid=valid, masked=masked, reward=_dump_reward(sample)
    )


def _dump_reward(sample: Mapping[str, Any]) -> float | None:
    reward = sample.get("reward")
    if isinstance(reward, Mapping):
        if "reward" not in reward:
            raise ValueError(
                f"sample {sample.get('index')} has a dict reward without a 'reward' key: {sorted(reward)}"
            )
        reward = reward["reward"]
    if reward is None or isinstance(reward, bool):
        return None
    value = float(reward)
    return value if math.isfinite(value) else None


# ---- torch-free reader for torch.save zip files ------------------------------------------------

_STORAGE_DTYPES = {
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16",
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
    "UntypedStorage": np.uint8,
}
_SAFE_GLOBALS = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "slice"): slice,
    ("collections", "OrderedDict"): dict,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class UnsupportedDumpError(Rl360Error, ValueError):
    """The dump holds an object the torch-free reader will not build."""


class DumpRecord(dict):
    """Stand-in for a Miles object found in a dump (AdapterRef, RewardSpec, an Enum): its fields as a dict."""

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if args:
            self["args"] = list(args)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple):  # (dict_state, slots_state)
            state = {k: v for part in state if isinstance(part, Mapping) for k, v in part.items()}
        if isinstance(state, Mapping):
            self.update(state)


def _storage(kind: Any, key: str, archive: zipfile.ZipFile, prefix: str) -> np.ndarray:
    name = getattr(kind, "storage_name", None)
    if name not in _STORAGE_DTYPES:
        raise UnsupportedDumpError(f"tensor storage of type {kind!r} is not supported without torch")
    raw = archive.read(f"{prefix}data/{key}")
    if _STORAGE_DTYPES[name] == "bfloat16":
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32)
    dtype = np.dtype(_STORAGE_DTYPES[name]).newbyteorder("<")
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))


def _rebuild_tensor(
    storage: np.ndarray, offset: int, size: Sequence[int], stride: Sequence[int], *_: Any
) -> np.ndarray:
    if not size:
        return storage[offset].copy()
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * item for s in stride), writeable=False
    )
    return np.array(view)


class _StorageType:
    def __init__(self, storage_name: str) -> None:
        self.storage_name = storage_name

    def __repr__(self) -> str:
        return f"torch.{self.storage_name}"


class _DumpUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(file)
        self._archive = archive
        self._prefix = prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS:
            return _SAFE_GLOBALS[(module, name)]
        if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in (
            "_reconstruct",
            "scalar",
        ):
            return getattr(_numpy_multiarray(), name)
        if module in ("numpy._core.numeric", "numpy.core.numeric") and name == "_frombuffer":
            return _frombuffer
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if module == "torch" and name == "Size":
            return tuple
        if module.split(".")[0] == "miles":
            return type(name, (DumpRecord,), {"__module__": "rl360_ext.rollout.audit"})
        raise UnsupportedDumpError(
            f"the dump references {module}.{name}, which the torch-free reader does not load"
        )

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage" and len(pid) >= 5):
            raise UnsupportedDumpError(f"unknown persistent id in dump: {pid!r}")
        _, kind, key = pid[:3]
        return _storage(kind, str(key), self._archive, self._prefix)


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """How protocol-2 pickles spell bytes (numpy array data): `_codecs.encode(str, "latin1")`."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsupportedDumpError(f"unexpected _codecs.encode({type(text).__name__}, {encoding!r}) in dump")
    return text.encode("latin1")


def _numpy_multiarray() -> Any:
    try:
        return importlib.import_module("numpy._core.multiarray")
    except ImportError:
        return importlib.import_module("numpy.core.multiarray")


def _frombuffer(buffer: bytes, dtype: Any, shape: Sequence[int], order: str) -> np.ndarray:
    array = np.frombuffer(buffer, dtype=dtype)
    return array.reshape(shape, order=order if order in ("C", "F") else "C")


def read_miles_dump(path: Path) -> dict[str, Any]:
    """The payload of a Miles debug rollout dump, read without torch.

    Tensors come back as numpy arrays; Miles objects (AdapterRef, ...) as `DumpRecord` dicts.
    When the dump holds something this reader refuses and torch is installed, it falls back to
    `torch.load(weights_only=False)` (which runs the pickle: only for your own dumps).
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a torch.save zip file (Miles writes dumps with torch.save)")
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if len(pickles) != 1:
            raise ValueError(f"{path}: expected one data.pkl in the archive, found {pickles}")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = f"{prefix}byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() not in (b"little", b""):
            raise ValueError(f"{path}: big-endian dumps are not supported")
        try:
            payload = _DumpUnpickler(io.BytesIO(archive.read(pickles[0])), archive, prefix).load()
        except UnsupportedDumpError as error:
            payload = _torch_load(path, error)
    if not isinstance(payload, Mapping):
        raise ValueError(f"{path}: the dump holds a {type(payload).__name__}, expected a dict")
    return dict(payload)


def _torch_load(path: Path, reason: Exception) -> Any:
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError as error:
        raise UnsupportedDumpError(
            f"{path}: {reason}; install torch to read this dump with torch.load"
        ) from error
    return torch.load(path, weights_only=False, map_location="cpu")


# ---- CLI entry -----------------------------------------------------------------------------


def format_step(audit: StepAudit) -> str:
    """One human line per step, e.g. "gradient x0.59 ... advantage +0.31"."""

    def num(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    parts = [
        f"step {audit.step} ({audit.source}): {audit.trained} trained, {audit.masked} masked",
        f"gradient x{num(audit.gradient_scale_upstream, '.2f')} (masked samples in the denominator)",
        f"advantage {num(audit.advantage_shift_whole_batch, '+.2f')} with a whole-batch baseline "
        f"{num(audit.baseline_whole_batch, '.2f')} vs kept mean {num(audit.kept_mean, '.2f')}, "
        f"{num(audit.advantage_shift_group_masked_zero, '+.2f')} with masked-as-zero group baselines",
        f"logged mean {num(audit.logged_mean_upstream, '.2f')} vs valid mean {num(audit.kept_mean, '.2f')} "
        f"(bias {num(audit.logged_mean_bias, '+.2f')})",
    ]
    if audit.unfiltered_mean is not None:
        parts.append(
            f"unfiltered mean {audit.unfiltered_mean:.2f} "
            f"(kept - unfiltered {num(audit.filter_bias, '+.2f')})"
        )
    if audit.note:
        parts.append(audit.note)
    if audit.gate is not None:
        reasons = "; ".join(_gate_reason(r) for r in audit.gate["reasons"])
        parts.append(f"gate {audit.gate['action']}" + (f": {reasons}" if reasons else ""))
    return " | ".join(parts)


def audits_as_json(audits: Iterable[StepAudit]) -> str:
    return json.dumps([asdict(a) for a in audits], indent=2)


def main(path: Path, as_json: bool) -> None:
    """`rl360 audit PATH [--json]`: print one audit per step found in PATH."""
    audits = load_steps(path)
    if as_json:
        print(audits_as_json(audits))
        return
    for audit in audits:
        print(format_step(audit))
    if (gated := gate_summary(audits)) is not None:
        print(gated)
