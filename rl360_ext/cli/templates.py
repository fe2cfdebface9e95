"""`rl360 template ...` commands (thin: parse flags, call into rl360_ext.templates).

`check` exits 0 when the template is append-only on every generated conversation, 1 on a
violation or when nothing was checked (0 split points), 2 on bad input (missing directory,
unreadable template, unloadable tokenizer, an `--end-token` that is no token of the tokenizer, an
unknown `--reasoning` / `--tool-format`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from rl360_ext.util.flags import key_values

app = typer.Typer(
    help="Chat templates: the append-only checker and the fixed templates.", no_args_is_help=True
)

TOKENIZER_DIR = typer.Argument(
    ...,
    metavar="TOKENIZER_DIR",
    help="Local tokenizer directory (tokenizer.json, tokenizer_config.json), e.g. a model snapshot.",
)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _load_tokenizer(directory: Path) -> Any:
    if not directory.is_dir():
        raise _fail(f"tokenizer directory not found: {directory}")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" note
    from rl360_ext.templates.tokenizer import load_hf_tokenizer

    try:
        return load_hf_tokenizer(str(directory.resolve()))
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for bad directories
        raise _fail(f"cannot load a tokenizer from {directory}: {exc}") from None


@app.command()
def check(
    tokenizer_dir: Path = TOKENIZER_DIR,
    template: Annotated[
        Path | None,
        typer.Option("--template", help="Check this Jinja file instead of the tokenizer's template."),
    ] = None,
    fixed: bool = typer.Option(
        False, "--fixed", help="Check the fixed template rl360 picks for this tokenizer."
    ),
    cases: int = typer.Option(200, min=1, help="Generated conversations to check."),
    seed: int = typer.Option(0, help="Seed of the conversation generator."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    end_token: list[str] = typer.Option(
        [],
        "--end-token",
        help="A token that ends the model's turn (repeatable; 'none': the next role token ends it). "
        "Default: read off the template.",
    ),
    reasoning: str | None = typer.Option(
        None, help="How the model emits reasoning: think, harmony or none (default: detected)."
    ),
    tool_format: str | None = typer.Option(
        None,
        help="The model's tool-call format: hermes, glm-xml, llama3-json, harmony, deepseek, kimi, "
        "mistral, gemma or none (default: detected).",
    ),
    kwarg: list[str] = typer.Option(
        [], help="Template variable KEY=JSON, e.g. enable_thinking=false (repeatable)."
    ),
) -> None:
    """Prove or refute that a chat template is append-only for token-in/token-out sessions."""
    if template is not None and fixed:
        raise _fail("--template and --fixed are exclusive")
    tokenizer = _load_tokenizer(tokenizer_dir)
    try:
        template_kwargs = key_values(kwarg)
    except ValueError as exc:
        raise _fail(f"--kwarg: {exc} (VALUE as JSON, e.g. enable_thinking=false)") from None
    from rl360_ext.templates.check import check_template
    from rl360_ext.templates.select import choose_fixed_template

    choice = choose_fixed_template(tokenizer)
    text, label = None, f"chat_template of {tokenizer_dir}"
    if template is not None:
        try:
            text, label = template.read_text(), str(template)
        except (OSError, UnicodeDecodeError) as exc:
            raise _fail(f"cannot read template {template}: {exc}") from None
    elif fixed:
        if choice.text is None:
            raise _fail(f"no fixed template for {tokenizer_dir}: {choice.reason}")
        text, label = choice.text, f"rl360 fixed template {choice.name!r}"
    try:
        report = check_template(
            tokenizer,
            text,
            cases=cases,
            seed=seed,
            end_token=end_token or None,
            reasoning=reasoning,
            tool_format=tool_format,
            template_kwargs=template_kwargs,
            label=label,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    suggest = not report.ok and template is None and not fixed and choice.name is not None
    if as_json:
        data = report.to_json()
        data["fixed_template"] = {"name": choice.name, "reason": choice.reason}
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        typer.echo(report.summary())
        if suggest:
            typer.echo(
                f"\nrl360 has a fixed template for this tokenizer: {choice.name!r} ({choice.reason}).\n"
                f"Check it with: rl360 template check {tokenizer_dir} --fixed"
            )
    raise typer.Exit(0 if report.ok else 1)


@app.command()
def fixed(
    tokenizer_dir: Path = TOKENIZER_DIR,
    out: Annotated[Path | None, typer.Option(help="Write the template here instead of stdout.")] = None,
) -> None:
    """Print (or write) the fixed append-only template rl360 picks for a tokenizer; exit 1 if none."""
    tokenizer = _load_tokenizer(tokenizer_dir)
    from rl360_ext.templates.select import choose_fixed_template

    choice = choose_fixed_template(tokenizer)
    typer.echo(f"{choice.name or 'none'}: {choice.reason}", err=True)
    if choice.text is None:
        raise typer.Exit(1)
    if out is None:
        typer.echo(choice.text, nl=False)
    else:
        try:
            out.write_text(choice.text)
        except OSError as exc:
            raise _fail(f"cannot write {out}: {exc}") from None
