"""`rl360 session ...` commands (thin: parse flags, call into rl360_ext.session)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="The delta-R3 token-in/token-out session server.", no_args_is_help=True)


@app.command()
def serve(
    backend: Annotated[str, typer.Option(help="SGLang-protocol base URL: an engine or the SMG gateway.")],
    tokenizer: Annotated[Path, typer.Option(help="Tokenizer directory (with its chat template).")],
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(8100, help="Port."),
    r3: bool = typer.Option(False, "--r3", help="Record routing replay (delta R3) rows per turn."),
    history_mismatch: str = typer.Option(
        "fork", help="When an agent's history is not an append: fork (new segment) or reject (409)."
    ),
    allow_non_append_only: bool = typer.Option(
        False, "--allow-non-append-only", help="Start even if the template checker rejects the template."
    ),
    max_sessions: int = typer.Option(4096, min=1, help="Sessions held at once."),
    idle_ttl: float = typer.Option(7200.0, min=0.001, help="Drop sessions idle this many seconds."),
    model_name: str | None = typer.Option(
        None, help="Model name in replies and /v1/models (default: the backend's, from its /v1/models)."
    ),
    r3_layers: int | None = typer.Option(None, min=1, help="MoE layers (default: config.json, /model_info)."),
    r3_top_k: int | None = typer.Option(None, min=1, help="Experts per token (default: as above)."),
    r3_experts: int | None = typer.Option(None, min=1, help="Experts per layer (default: as above)."),
    public_url: str | None = typer.Option(None, help="Base URL agents reach this server at."),
    chat_template: str | None = typer.Option(
        None, help="Template to render with: a .jinja file, or 'fixed' for rl360's fixed template."
    ),
    instance_id: str | None = typer.Option(
        None, help="session_server_instance_id that /health reports (Miles' per-server id; default: random)."
    ),
    samples_wire: str = typer.Option(
        "v1", help="Miles' --use-session-server version /samples answers: v1 (one sample), v2 (per branch)."
    ),
) -> None:
    """Serve token-in/token-out chat sessions in front of an SGLang engine or gateway."""
    from rl360_ext.session.service import ServiceOptions, ServiceStartupError
    from rl360_ext.session.service import serve as run

    if samples_wire not in ("v1", "v2"):
        raise typer.BadParameter("must be v1 or v2", param_hint="--samples-wire")
    if history_mismatch not in ("fork", "reject"):
        raise typer.BadParameter("must be fork or reject", param_hint="--history-mismatch")
    options = ServiceOptions(
        backend_url=backend,
        tokenizer_dir=str(tokenizer),
        r3=r3,
        history_mismatch=history_mismatch,
        allow_non_append_only=allow_non_append_only,
        max_sessions=max_sessions,
        idle_ttl_s=idle_ttl,
        model_name=model_name,
        routing_layers=r3_layers,
        routing_top_k=r3_top_k,
        routing_experts=r3_experts,
        public_url=public_url,
        chat_template=chat_template,
        instance_id=instance_id,
        samples_wire=samples_wire,
    )
    try:
        run(options, host, port)
    except ServiceStartupError as exc:
        typer.echo(f"rl360 session serve: {exc}", err=True)
        raise typer.Exit(2) from None
