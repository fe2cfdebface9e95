"""Miles' session-server flags mapped to rl360's session-server options (pure, imports no Miles).

Owns `service_options(args)`: the `SessionServerConfig` (what `rl360 session serve` and the
`SessionPool` take) for the flags Miles' launcher hands its own session servers
(`--hf-checkpoint`, `--chat-template-path`, `--use-rollout-routing-replay`,
`--miles-router-timeout`, `--use-session-server v1|v2`, the per-server instance id, the router
address), refusing with a `MilesFlagError` naming the flag the ones rl360 cannot honour
(per-request template kwargs, indexer replay, LoRA, Miles' v2 pick/post-process hooks, named
TITO models), so a launch never silently trains on something else; and `session_ports(args)`,
Miles' `--session-server-port` rule (one port, or a `[start, end)` range). docs/session.md has
the table. It does not start servers (`service.py`, `pool.py`).
"""

from __future__ import annotations

from typing import Any

from rl360_ext.errors import Rl360Error
from rl360_ext.session.service import SessionServerConfig

DEFAULT_PICKER = "miles.rollout.session.v2.picker_hub.drop_retries"
DEFAULT_POSTPROCESSOR = "miles.rollout.session.v2.postprocessor_hub.default_postprocess"
MILES_DEFAULT_TIMEOUT_S = 600.0  # Miles' session server: getattr(args, "miles_router_timeout", 600.0)


class MilesFlagError(Rl360Error, ValueError):
    """A Miles session-server flag rl360's server cannot honour (the message names it and says why)."""


def session_ports(args: Any) -> list[int]:
    """The ports `--session-server-port` names: one value, or a half-open `[start, end)` range."""
    raw = getattr(args, "session_server_port", None)
    if not raw:
        raise MilesFlagError(
            "--session-server-port: rl360's servers need their ports named (one, or start end)"
        )
    if len(raw) == 1:
        return [int(raw[0])]
    if len(raw) == 2 and raw[0] < raw[1]:
        return list(range(int(raw[0]), int(raw[1])))
    raise MilesFlagError(f"--session-server-port: one port or a non-empty start/end range, got {list(raw)}")


def _refusals(args: Any) -> list[str]:
    refused = []
    if getattr(args, "apply_chat_template_kwargs", None):
        refused.append(
            "--apply-chat-template-kwargs: rl360 renders with one append-only template; pass a template "
            "file that renders as wanted (rl360 session serve --chat-template FILE)"
        )
    if getattr(args, "use_rollout_indexer_replay", False):
        refused.append("--use-rollout-indexer-replay: rl360 records no indexer top-k")
    if (getattr(args, "lora_rank", 0) or 0) > 0 or getattr(args, "lora_adapter_path", None) is not None:
        refused.append("--lora-rank/--lora-adapter-path: rl360's session server selects no LoRA adapter")
    if getattr(args, "tito_model", "default") != "default":
        refused.append(
            f"--tito-model {args.tito_model}: rl360 uses its own TITO with the checked template "
            "(--chat-template fixed for rl360's fixed template)"
        )
    for flag, name, default in (
        ("--session-sample-picker-path", "session_sample_picker_path", DEFAULT_PICKER),
        ("--session-sample-postprocessor-path", "session_sample_postprocessor_path", DEFAULT_POSTPROCESSOR),
    ):
        value = getattr(args, name, default)
        if value not in (None, default):
            refused.append(
                f"{flag} {value}: rl360 does not run Miles' v2 hooks; it applies the defaults' rules itself"
            )
    return refused


def service_options(args: Any, backend_url: str | None = None) -> SessionServerConfig:
    """rl360's options for a session server Miles would start with `args` (raises MilesFlagError).

    `backend_url` defaults to Miles' router (`sglang_router_ip`/`sglang_router_port`), which Miles'
    own session servers call.
    """
    refused = _refusals(args)
    if refused:
        raise MilesFlagError("; ".join(refused))
    checkpoint = getattr(args, "hf_checkpoint", None)
    if not checkpoint:
        raise MilesFlagError("--hf-checkpoint: the session server needs the tokenizer (and its template)")
    if backend_url is None:
        ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
        if not ip or not port:
            raise MilesFlagError("--sglang-router-ip/--sglang-router-port: no backend to call (or pass one)")
        backend_url = f"http://{ip}:{port}"
    version = getattr(args, "use_session_server", False)
    return SessionServerConfig(
        backend_url=backend_url,
        tokenizer_dir=str(checkpoint),
        r3=bool(getattr(args, "use_rollout_routing_replay", False)),
        engine_timeout_s=float(getattr(args, "miles_router_timeout", None) or MILES_DEFAULT_TIMEOUT_S),
        chat_template=getattr(args, "chat_template_path", None),
        instance_id=getattr(args, "session_server_instance_id", None),
        samples_wire="v2" if version == "v2" else "v1",
    )
