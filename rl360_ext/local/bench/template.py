"""Benchmark of the append-only checker (`rl360 bench template`): is it cheap enough for server start?

Owns one measurement on the tiny engine's tokenizer: the baseline is rendering and tokenizing every
request of the default 200 generated conversations once (the work a session server does for them
anyway); against it, a full `check_template` run on an append-only template (the reference) and on
a broken one (the reference with a newline after each end-of-turn token: every violation found,
then shrunk). It does not test correctness (tests/templates).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

CASES = 200


def _seconds(run: Callable[[], Any], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main(as_json: bool) -> None:
    from rl360_ext.reference.engine.tokenizer import chat_template, load_tiny_tokenizer
    from rl360_ext.templates.check import check_template
    from rl360_ext.templates.conversations import generate_conversations
    from rl360_ext.templates.render import ChatRenderer

    tokenizer = load_tiny_tokenizer()
    renderer = ChatRenderer(tokenizer)
    conversations = generate_conversations(CASES, 0)

    def render_requests() -> None:
        for conversation in conversations:
            messages = list(conversation.prompt)
            for turn in conversation.turns:
                renderer.prompt_ids(messages, conversation.tools)
                messages += [turn.assistant, *turn.new_messages]

    broken = chat_template().replace("<|im_end|>", "<|im_end|>{{ '\n' }}")
    baseline = _seconds(render_requests)
    rows = [("render+tokenize each request once (baseline)", baseline, "-")]
    for name, template in (("reference (append-only)", None), ("broken (newline after end)", broken)):
        violations = len(check_template(tokenizer, template).violations)
        rows.append(
            (f"check_template, {name}", _seconds(lambda t=template: check_template(tokenizer, t)), violations)
        )
    results = [
        {
            "case": name,
            "seconds": round(seconds, 4),
            "ms_per_conversation": round(1000 * seconds / CASES, 3),
            "x_baseline": round(seconds / baseline, 2),
            "violations": violations,
        }
        for name, seconds, violations in rows
    ]
    if as_json:
        print(json.dumps({"cases": CASES, "results": results}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "case",
        "seconds",
        "ms / conversation",
        "x baseline",
        "violations",
        title=f"template check, {CASES} conversations",
    )
    for row in results:
        table.add_row(
            row["case"],
            f"{row['seconds']:.3f}",
            f"{row['ms_per_conversation']:.2f}",
            f"{row['x_baseline']:.1f}",
            str(row["violations"]),
        )
    Console().print(table)
