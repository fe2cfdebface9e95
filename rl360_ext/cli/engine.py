"""`rl360 engine ...` commands (thin: parse flags, call into rl360_ext.reference.engine).

`serve`'s flags are derived from `rl360_ext.reference.engine.config.EngineConfig` by
`rl360_ext.cli.fields`: one flag per field, its default, bounds and help (the field's docstring)
taken from the dataclass, so a new engine setting is one field there and nothing here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rl360_ext.cli.fields import config_command
from rl360_ext.reference.engine.config import EngineConfig

app = typer.Typer(
    help="The tiny CPU reference engine (SGLang's native protocol), its tokenizer and weights.",
    no_args_is_help=True,
)

SEED = typer.Option(0, help="Seed of the deterministic weights.")
LAYERS = typer.Option(4, min=1, help="Transformer layers.")
EXPERTS = typer.Option(8, min=1, help="MoE experts per layer.")
TOP_K = typer.Option(2, "--top-k", min=1, help="Experts routed per token.")


def serve(config: EngineConfig) -> None:
    """Serve the tiny MoE engine with SGLang's native HTTP protocol."""
    import uvicorn

    from rl360_ext.reference.engine.engine import TinyEngine
    from rl360_ext.reference.engine.server import create_app, guarded_protocol

    try:
        engine = TinyEngine(config)
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err)) from None
    size = f"{config.layers} layers, {config.experts} experts, top-{config.top_k}, vocab {engine.vocab_size}"
    chunk = config.prefill_chunk or "off"
    token = ", bearer token required" if config.api_key else ""
    typer.echo(
        f"rl360 tiny engine ({size}, seed {config.seed}, chunked prefill {chunk}{token}) "
        f"on http://{config.host}:{config.port}",
        err=True,
    )
    uvicorn.run(
        create_app(engine),
        host=config.host,
        port=config.port,
        http=guarded_protocol(),
        log_level="warning",
        access_log=False,
    )


app.command("serve")(config_command(EngineConfig, serve))


@app.command()
def tokenizer(directory: Annotated[Path, typer.Argument(help="Output directory.")]) -> None:
    """Write the tiny engine's tokenizer as a Hugging Face tokenizer directory."""
    from rl360_ext.reference.engine.tokenizer import write_tokenizer_dir

    typer.echo(str(write_tokenizer_dir(directory)))


@app.command("save-weights")
def save_weights(
    out: Annotated[Path, typer.Argument(help="Output .npz file (or directory: writes weights.npz in it).")],
    seed: int = SEED,
    layers: int = LAYERS,
    experts: int = EXPERTS,
    top_k: int = TOP_K,
    perturb: float = typer.Option(0.0, min=0.0, help="Add Gaussian noise of this scale (a stand-in update)."),
    perturb_seed: int = typer.Option(1, help="Seed of the perturbation noise."),
) -> None:
    """Write the seed's weights (optionally perturbed) for /update_weights_from_disk."""
    from rl360_ext.reference.engine.model import ModelConfig, init_weights, perturb_weights
    from rl360_ext.reference.engine.model import save_weights as write
    from rl360_ext.reference.engine.tokenizer import build_tokenizer

    config = ModelConfig(
        vocab_size=build_tokenizer().get_vocab_size(), layers=layers, experts=experts, top_k=top_k
    )
    weights = init_weights(config, seed)
    if perturb > 0:
        weights = perturb_weights(weights, perturb, perturb_seed)
    typer.echo(str(write(out, config, weights)))


@app.command()
def instant(
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(30000, help="Port."),
    layers: int = typer.Option(4, min=1, help="MoE layers in routed_experts."),
    top_k: int = typer.Option(2, "--top-k", min=1, help="Experts per token in routed_experts."),
    experts: int = typer.Option(8, min=1, help="Experts per layer reported in /model_info."),
) -> None:
    """Serve the instant SGLang stand-in: a fixed reply at once, for session-server load benchmarks."""
    import uvicorn

    from rl360_ext.reference.engine.instant import InstantConfig, create_app
    from rl360_ext.reference.engine.server import guarded_protocol

    try:
        config = InstantConfig(layers=layers, top_k=top_k, experts=experts)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    app_ = create_app(config)
    uvicorn.run(app_, host=host, port=port, http=guarded_protocol(), log_level="warning", access_log=False)
