"""Assembling a session server from its options: tokenizer, template check, routing shape, backend.

Owns turning `SessionServerConfig` (`options.py`: everything `rl360 session serve` and the Ray pool
pass) into a running server: resolving the R3 routing shape (explicit options, else the model's
`config.json` next to the tokenizer, else the backend's model info) and the vocabulary size,
the startup append-only check of the chat template (refuse to start on a violation unless
allowed), building the `SessionCore`, the app with its body limit and bearer token (`app_for`),
and running it under uvicorn. It does not own the HTTP routes (`app.py`) or session logic
(`core.py`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import httpx

from rl360_ext.errors import Rl360Error
from rl360_ext.session.config import SessionCoreConfig
from rl360_ext.session.core import SessionCore
from rl360_ext.session.options import DEFAULT_MODEL_NAME, SessionServerConfig
from rl360_ext.session.samples.routing import RoutingShape, shape_from_model_config

log = logging.getLogger("rl360.session")
TEMPLATE_CHECK_CASES = 200  # generated conversations the startup check replays (~0.5 s)
# An agent's connection waits out its tool calls between turns: keep it open that long (uvicorn's
# default of 5 s would close it, and a turn sent just as the server closes it fails to connect).
KEEP_ALIVE_S = 75.0


class ServiceStartupError(Rl360Error, RuntimeError):
    """The server must not start with these options (the message says why and what to pass)."""


def resolve_chat_template(tokenizer: Any, choice: str | None) -> str | None:
    """The template the server renders with: the tokenizer's (None), our fixed one, or a file's text."""
    if choice is None:
        return None
    if choice == "fixed":
        from rl360_ext.templates.select import fixed_template_for

        fixed = fixed_template_for(tokenizer)
        if fixed is None:
            raise ServiceStartupError(
                "--chat-template fixed: rl360 has no fixed template for this tokenizer's family "
                "(or its own template is already one of ours); pass a template file instead"
            )
        return fixed
    path = Path(choice)
    if not path.is_file():
        raise ServiceStartupError(f"--chat-template: {choice} is not a file (or 'fixed')")
    return path.read_text()


def model_card(backend_url: str) -> dict[str, Any]:
    """The first model card of the backend's `/v1/models` (as SGLang and the SMG gateway answer
    it), or {} when it serves none."""
    try:
        response = httpx.get(backend_url.rstrip("/") + "/v1/models", timeout=10.0)
        cards = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return {}
    first = cards[0] if isinstance(cards, list) and cards else None
    return first if isinstance(first, dict) else {}


def served_model_name(card: dict[str, Any], backend_url: str) -> str:
    """The model id of the backend's card; DEFAULT_MODEL_NAME, with a warning, when it names none."""
    name = card.get("id")
    if isinstance(name, str) and name:
        return name
    log.warning("%s/v1/models names no model; replies say %r", backend_url, DEFAULT_MODEL_NAME)
    return DEFAULT_MODEL_NAME


def context_tokens(card: dict[str, Any], options: SessionServerConfig) -> int | None:
    """--max-context-tokens, else the card's `max_model_len` (SGLang's context length), else None."""
    if options.max_context_tokens is not None:
        return options.max_context_tokens
    length = card.get("max_model_len")
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None


def chars_per_token(tokenizer: Any, options: SessionServerConfig) -> int:
    """--max-chars-per-token, else the longest token of the vocabulary in characters: no token
    covers more, so a text of N characters is at least N / this many tokens."""
    if options.max_chars_per_token is not None:
        return options.max_chars_per_token
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


def _shape_from_model_info(info: dict[str, Any]) -> RoutingShape | None:
    layers = info.get("num_layers") or info.get("num_hidden_layers")
    top_k = info.get("num_experts_per_tok") or info.get("moe_topk")
    experts = info.get("num_experts") or info.get("n_routed_experts")
    if layers and top_k and experts:
        return RoutingShape(int(layers), int(top_k), int(experts))
    return None


def _model_info(backend_url: str) -> dict[str, Any]:
    """The backend's model info (engines serve /model_info, the SMG gateway /get_model_info)."""
    for path in ("/model_info", "/get_model_info"):
        try:
            response = httpx.get(backend_url.rstrip("/") + path, timeout=10.0)
            info = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            info = None
        if isinstance(info, dict):
            return info
    return {}


def resolve_routing_shape(options: SessionServerConfig) -> RoutingShape | None:
    """The routing shape R3 needs; None without --r3. Raises ServiceStartupError if unknown."""
    if not options.r3:
        return None
    given = (options.routing_layers, options.routing_top_k, options.routing_experts)
    if all(v is not None for v in given):
        return RoutingShape(*given)  # type: ignore[arg-type]
    shape = shape_from_model_config(options.tokenizer_dir)
    if shape is None:
        shape = _shape_from_model_info(_model_info(options.backend_url))
    if shape is None:
        raise ServiceStartupError(
            "--r3 needs the routing shape: pass --r3-layers, --r3-top-k and --r3-experts (no config.json "
            f"with MoE sizes in {options.tokenizer_dir}, and {options.backend_url} reports no MoE sizes)"
        )
    return RoutingShape(
        options.routing_layers or shape.layers,
        options.routing_top_k or shape.top_k,
        options.routing_experts or shape.num_experts,
    )


def check_template_or_refuse(renderer: Any, options: SessionServerConfig) -> dict[str, Any]:
    """Run the append-only checker on the server's template; refuse to start on a violation.

    With `allow_non_append_only` the server starts anyway (each new session logs a warning).
    Returns the template facts every merged sample carries in its metadata.
    """
    from rl360_ext.templates.check import check_template

    report = check_template(
        renderer.tokenizer, renderer.chat_template, cases=TEMPLATE_CHECK_CASES, renderer=renderer
    )
    if not report.ok and not options.allow_non_append_only:
        raise ServiceStartupError(
            f"the chat template in {options.tokenizer_dir} is not append-only, so token-in/token-out "
            "would train on a context the model never saw. Use a fixed template (rl360 template fixed) "
            f"or pass --allow-non-append-only.\n{report.summary()}"
        )
    if not report.ok:
        log.warning("starting with a chat template that is not append-only:\n%s", report.summary())
    return {
        "tokenizer_dir": options.tokenizer_dir,
        "chat_template_sha256": hashlib.sha256(renderer.chat_template.encode()).hexdigest(),
        "append_only": report.ok,
        "incremental_suffix": report.incremental,
        "end_token": report.end_token,
        "checked_conversations": report.cases,
        "violations": [v.kind for v in report.violations],
    }


def build_core(options: SessionServerConfig) -> SessionCore:
    """Load the tokenizer, check the template, resolve R3 and connect the backend client."""
    from rl360_ext.session.tito import TitoRenderer
    from rl360_ext.sglang.client import EngineClient
    from rl360_ext.templates.isolated_encoder import IsolatedEncoder
    from rl360_ext.templates.render import ChatRenderer
    from rl360_ext.templates.tokenizer import fast_encoder, load_hf_tokenizer

    tokenizer = load_hf_tokenizer(options.tokenizer_dir)
    encoder = IsolatedEncoder(options.tokenizer_dir, fast_encoder(tokenizer))
    renderer = ChatRenderer(
        tokenizer, resolve_chat_template(tokenizer, options.chat_template), encoder=encoder
    )
    facts = check_template_or_refuse(renderer, options)
    identity = {} if options.instance_id is None else {"instance_id": options.instance_id}
    card = {} if options.model_name and options.max_context_tokens else model_card(options.backend_url)
    config = SessionCoreConfig(
        **identity,
        samples_wire=options.samples_wire,  # type: ignore[arg-type]
        top_logprobs_num=options.top_logprobs_num,
        r3=options.r3,
        routing_shape=resolve_routing_shape(options),
        history_mismatch=options.history_mismatch,  # type: ignore[arg-type]
        max_sessions=options.max_sessions,
        idle_ttl_s=options.idle_ttl_s,
        model_name=options.model_name or served_model_name(card, options.backend_url),
        max_context_tokens=context_tokens(card, options),
        max_chars_per_token=chars_per_token(tokenizer, options),
        template_facts=facts,
        template_append_only=facts["append_only"],
        vocab_size=resolve_vocab_size(tokenizer, options),
    )
    backend = EngineClient(options.backend_url, timeout_s=options.engine_timeout_s)
    return SessionCore(TitoRenderer(renderer), backend, config)


def resolve_vocab_size(tokenizer: Any, options: SessionServerConfig) -> int:
    """Token ids the engine may return: --vocab-size, else max(len(tokenizer), config.json vocab_size)."""
    if options.vocab_size is not None:
        return options.vocab_size
    size = len(tokenizer)
    path = Path(options.tokenizer_dir) / "config.json"
    if path.is_file():
        config = json.loads(path.read_text())
        declared = config.get("text_config", config).get("vocab_size")
        if isinstance(declared, int) and declared > size:
            size = declared
    return size


def app_for(core: SessionCore, options: SessionServerConfig) -> Any:
    """The FastAPI app for `core` with the options' public URL, body limit and bearer token."""
    from rl360_ext.session.app import create_app

    try:
        token = options.bearer_token()
    except (OSError, ValueError) as exc:
        raise ServiceStartupError(f"--api-key-file: {exc}") from exc
    return create_app(
        core, public_url=options.public_url, max_request_bytes=options.max_request_bytes, api_key=token
    )


def serve(options: SessionServerConfig, host: str, port: int) -> None:
    """Build the core and serve it with uvicorn until interrupted.

    uvicorn picks uvloop (a dependency) over asyncio's loop by itself; the protocol is httptools
    under the shared head guard (`app.guarded_protocol`).
    """
    import uvicorn

    from rl360_ext.session.app import guarded_protocol

    app = app_for(build_core(options), options)
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=guarded_protocol(),
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
