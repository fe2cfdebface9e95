"""`rl360 engine ...` commands (thin: parse flags, call into rl360_ext.tiny_engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="The tiny CPU reference engine (SGLang's native protocol), its tokenizer and weights.",
    no_args_is_help=True,
)

SEED = typer.Option(0, help="Seed of the deterministic weights.")
LAYERS = typer.Option(4, min=1, help="Transformer layers.")
EXPERTS = typer.Option(8, min=1, help="MoE experts per layer.")
TOP_K = typer.Option(2, "--top-k", min=1, help="Experts routed per token.")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Bind address."),
    port: int = typer.Option(30000, help="Port."),
    seed: int = SEED,
    layers: int = LAYERS,
    experts: int = EXPERTS,
    top_k: int = TOP_K,
    kv_capacity: int = typer.Option(65536, min=0, help="Prefix KV cache capacity in tokens (0 disables it)."),
    context_length: int = typer.Option(32768, min=2, help="Maximum prompt + output tokens."),
    tokenizer: Annotated[
        Path | None, typer.Option(help="Tokenizer directory (default: the built-in one).")
    ] = None,
    weights: Annotated[Path | None, typer.Option(help="Start from weights saved by `save-weights`.")] = None,
    model_name: str = typer.Option("rl360-tiny-moe", help="Served model name (/v1/models)."),
    faults: str = typer.Option(
        "", help="Fault injection, e.g. error_rate=0.1,latency_s=0.2,abort_rate=0.05,seed=1."
    ),
    dtype: str = typer.Option(
        "float64", help="The forward's arithmetic: float64, or float32 (differs from a float64 trainer)."
    ),
) -> None:
    """Serve the tiny MoE engine with SGLang's native HTTP protocol."""
    import uvicorn

    from rl360_ext.tiny_engine.engine import EngineConfig, TinyEngine
    from rl360_ext.tiny_engine.faults import FaultConfig
    from rl360_ext.tiny_engine.server import create_app

    try:
        fault_config = FaultConfig.parse_flag(faults)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--faults") from None
    config = EngineConfig(
        seed=seed,
        layers=layers,
        experts=experts,
        top_k=top_k,
        kv_capacity=kv_capacity,
        context_length=context_length,
        model_name=model_name,
        tokenizer_dir=str(tokenizer) if tokenizer else None,
        weights_path=str(weights) if weights else None,
        dtype=dtype,
        faults=fault_config,
    )
    try:
        engine = TinyEngine(config)
    except (ValueError, FileNotFoundError) as err:
        raise typer.BadParameter(str(err)) from None
    size = f"{layers} layers, {experts} experts, top-{top_k}, vocab {engine.vocab_size}"
    typer.echo(f"rl360 tiny engine ({size}, seed {seed}) on http://{host}:{port}", err=True)
    uvicorn.run(create_app(engine), host=host, port=port, log_level="warning", access_log=False)


@app.command()
def tokenizer(directory: Annotated[Path, typer.Argument(help="Output directory.")]) -> None:
    """Write the tiny engine's tokenizer as a Hugging Face tokenizer directory."""
    from rl360_ext.tiny_engine.tokenizer import write_tokenizer_dir

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
    from rl360_ext.tiny_engine.model import ModelConfig, init_weights, perturb_weights
    from rl360_ext.tiny_engine.model import save_weights as write
    from rl360_ext.tiny_engine.tokenizer import build_tokenizer

    config = ModelConfig(
        vocab_size=build_tokenizer().get_vocab_size(), layers=layers, experts=experts, top_k=top_k
    )
    weights = init_weights(config, seed)
    if perturb > 0:
        weights = perturb_weights(weights, perturb, perturb_seed)
    typer.echo(str(write(out, config, weights)))
