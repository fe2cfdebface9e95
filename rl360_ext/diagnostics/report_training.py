"""The step report's training sections, for a run that trained (`train` lines) or evaluated
(`eval` lines): the learning curve against the chance level, eval pass rates, the trust metrics
of every train step, and the version figures (token age, mixed-version, stale-KV and R3
provenance shares) when the samples carried per-token versions.
"""

from __future__ import annotations

from html import escape

from rl360_ext.diagnostics import page
from rl360_ext.diagnostics.charts import (
    Series,
    bar_chart,
    format_number,
    format_percent,
    legend,
    line_chart,
)
from rl360_ext.diagnostics.report_data import Run
from rl360_ext.diagnostics.report_series import (
    chance_level,
    eval_metric_series,
    eval_steps,
    step_metric_series,
    train_metric_series,
    trained_metric_series,
)
from rl360_ext.diagnostics.report_style import AGE_STYLE, PALETTE, STEP_AXIS, number_or_na

TRUST_FRACTIONS = (
    ("routing agreement", "#2e7d32", "train/routing_agreement"),
    ("loss scale", "#6a1b9a", "train/loss_scale"),
    ("pg clipfrac", "#ef6c00", "train/pg_clipfrac"),
    ("TIS clipfrac", "#00838f", "train/tis_clipfrac"),
)


MISMATCH_SERIES = (
    ("|Δ log p| mean", "#1565c0", "train/logprob_abs_diff_mean", False),
    ("|Δ log p| max", "#d81b60", "train/logprob_abs_diff_max", True),
    ("first token of a turn", "#2e7d32", "train/logprob_abs_diff_first_token_mean", False),
)


POLICY_LAG_SERIES = (
    ("lag |Δ log p| mean", "#ef6c00", "train/policy_lag_abs_diff_mean", False),
    ("lag |Δ log p| max", "#6a1b9a", "train/policy_lag_abs_diff_max", True),
    ("lag KL", "#00838f", "train/policy_lag_kl", False),
)


TRUST_TABLE = (
    ("|Δ log p| mean", "train/logprob_abs_diff_mean"),
    ("|Δ log p| max", "train/logprob_abs_diff_max"),
    ("first token", "train/logprob_abs_diff_first_token_mean"),
    ("top-k KL", "train/topk_kl"),
    ("top-k overlap", "train/topk_overlap"),
    ("TV bound max", "train/tv_bound_max"),
    ("routing agreement", "train/routing_agreement"),
    ("lag |Δ log p| mean", "train/policy_lag_abs_diff_mean"),
    ("lag |Δ log p| max", "train/policy_lag_abs_diff_max"),
    ("lag KL", "train/policy_lag_kl"),
    ("pg clipfrac", "train/pg_clipfrac"),
    ("TIS clipfrac", "train/tis_clipfrac"),
    ("grad norm", "train/grad_norm"),
    ("loss scale", "train/loss_scale"),
    ("valid", "train/valid_samples"),
    ("masked", "train/masked_samples"),
    ("train s", "train/time_s"),
)


NO_TRAIN = (
    "no train records. Miles' own trainer does not write them; rl360 demo appends one per step "
    "from the reference trainer."
)


def learning_section(run: Run) -> str:
    title = "Learning: every valid attempt's mean reward per step, against chance"
    level = chance_level(run)
    caption = (
        "<b>unfiltered mean</b> (reward/unfiltered_mean): valid attempts of every group, before the "
        "filter, so it measures the policy, not the batch. Dashed: the task's chance level"
        + ("" if level is None else f" ({format_number(level)})")
        + ", declared by the driver in its train records."
    )
    values = step_metric_series(run, "reward/unfiltered_mean")
    if not any(v is not None for v in values):
        return page.section(
            "chart-learning", title, caption, page.no_data("no step record carries reward/unfiltered_mean.")
        )
    series = [Series("unfiltered mean", "#1565c0", values)]
    if level is not None:
        series.append(Series("chance", "#757575", [level] * len(values), True))
    note = "" if run.train else f'<p class="partial">{escape(NO_TRAIN)}</p>'
    chart = line_chart(
        [str(rid) for rid in run.step_ids],
        series,
        x_label=STEP_AXIS,
        y_label="mean reward",
        y_range=(0.0, 1.0),
    )
    return page.section("chart-learning", title, caption, note + chart + legend(series))


def eval_section(run: Run) -> str:
    """Eval beside training (only for a run with eval records: no section otherwise)."""
    if not run.evals:
        return ""
    steps = eval_steps(run)
    datasets = sorted({e.dataset for e in run.evals})
    title = "Eval beside training: pass rate over valid attempts, infra rate beside it"
    caption = (
        "<b>training</b>: the unfiltered mean reward of the step's training attempts. Per eval "
        "dataset: <b>pass rate</b> (passes over valid attempts, "
        "<code>eval/&lt;name&gt;/pass_rate</code>) and, dashed, <b>upstream</b> (Miles' "
        "<code>eval/&lt;name&gt;</code>: mean reward with every infra attempt scored 0). Below: "
        "the share of each dataset's eval attempts lost to infrastructure."
    )
    if run.eval_notes:
        caption += (
            "<ul>"
            + "".join(
                f"<li><b>{escape(name)}</b>: {escape(note)}</li>"
                for name, note in sorted(run.eval_notes.items())
            )
            + "</ul>"
        )
    training = [
        None if (step := run.steps.get(rid)) is None else step.metric("reward/unfiltered_mean")
        for rid in steps
    ]
    series = [Series("training (unfiltered mean)", "#1565c0", training)]
    infra = []
    for number, dataset in enumerate(datasets):
        color = PALETTE[(number + 1) % len(PALETTE)]
        series.append(
            Series(f"{dataset} pass rate", color, eval_metric_series(run, dataset, "pass_rate", steps))
        )
        series.append(
            Series(f"{dataset} upstream", color, eval_metric_series(run, dataset, "upstream", steps), True)
        )
        infra.append(
            Series(f"{dataset} infra rate", color, eval_metric_series(run, dataset, "infra_rate", steps))
        )
    categories = [str(rid) for rid in steps]
    rates = line_chart(categories, series, x_label=STEP_AXIS, y_label="rate", y_range=(0.0, 1.0))
    lost = line_chart(
        categories, infra, x_label=STEP_AXIS, y_label="infra share", fmt=format_percent, y_range=(0.0, 1.0)
    )
    return page.section("chart-eval", title, caption, rates + legend(series)) + page.section(
        "chart-eval-infra", "Eval attempts lost to infrastructure", "", lost + legend(infra)
    )


def trust_section(run: Run) -> str:
    title = "Trust: the trainer against the sampler, every train step"
    caption = (
        "Before each update, two families kept apart. <b>Mismatch</b>: the trainer at the weights "
        "that sampled each token against the rollout's recorded log-probs, |Δ log p| over "
        "loss-masked-in tokens of valid samples (mean, max, and the mean over each turn's first "
        "generated token), routing agreement (share of (token, layer) rows where the trainer's "
        "own top-k at the row's version equals the replayed one), and where the engine returned "
        "its top-k log-probs the top-k KL (both directions, renormalised on the engine's top-k), "
        "the top-k overlap and an upper bound on the total variation between the full "
        "distributions. <b>Policy lag</b>: the current weights against the sampling version on "
        "the same tokens (|Δ log p| mean and max, KL(behaviour || current) by Miles' low_var_kl): "
        "the staleness PPO's ratio measures under --keep-old-actor. During the update: the share "
        "of tokens PPO clipped and TIS clamped, the gradient norm before clipping, and the loss "
        "scale (the gradient scale the pg-loss reducer applied relative to a mean over valid "
        "samples: 1.0 when nothing is masked, or when the reducer ignores masked samples)."
    )
    if not run.train:
        return page.section("chart-trust", title, caption, page.no_data(NO_TRAIN))
    categories = [str(rid) for rid in run.step_ids]
    fractions = [Series(n, c, train_metric_series(run, m)) for n, c, m in TRUST_FRACTIONS]
    fractions = [s for s in fractions if any(v is not None for v in s.values)]
    charts = ""
    if fractions:
        charts += line_chart(categories, fractions, x_label=STEP_AXIS, y_label="fraction", y_range=(0.0, 1.0))
        charts += legend(fractions)
    for family, label in ((MISMATCH_SERIES, "mismatch |Δ log p|"), (POLICY_LAG_SERIES, "policy lag")):
        series = [Series(n, c, train_metric_series(run, m), dashed) for n, c, m, dashed in family]
        series = [s for s in series if any(v is not None for v in s.values)]
        if series:
            charts += line_chart(categories, series, x_label=STEP_AXIS, y_label=label)
            charts += legend(series)
    columns = [train_metric_series(run, metric) for _, metric in TRUST_TABLE]
    rows = [
        (str(rid), *(number_or_na(column[position]) for column in columns))
        for position, rid in enumerate(run.step_ids)
        if rid in run.train
    ]
    table = page.table(
        ("rollout step", *(name for name, _ in TRUST_TABLE)), rows, (False, *[True] * len(TRUST_TABLE))
    )
    return page.section("chart-trust", title, caption, charts + table)


STALENESS_SHARES = (
    ("mixed-version samples", "#6a1b9a", "staleness/mixed_version_frac"),
    ("stale KV context", "#1565c0", "kv/stale_prefix_tokens_frac"),
    ("R3 rows from a later prefill", "#00838f", "r3/rows_from_later_prefill_frac"),
    ("… next turn's cache hit", "#4db6ac", "r3/rows_from_later_prefill_frac/cache_hit"),
    ("… next turn's cache miss", "#ff7043", "r3/rows_from_later_prefill_frac/cache_miss"),
)


STALENESS_TABLE = (
    ("age mean", "staleness/token_age_mean"),
    ("age p90", "staleness/token_age_p90"),
    ("age max", "staleness/token_age_max"),
    ("group spread max", "staleness/group_version_spread_max"),
    ("aged tokens", "staleness/aged_tokens"),
    ("unversioned tokens", "staleness/unversioned_tokens"),
)


def staleness_sections(run: Run) -> str:
    """Token ages and the version-mix shares per train step; nothing when no step carries them
    (a run without per-token version arrays)."""
    categories = [str(rid) for rid in run.step_ids]
    ages = [
        Series(f"age {label}", color, trained_metric_series(run, f"staleness/token_age_hist/{label}"))
        for label, color in AGE_STYLE
    ]
    shares = [Series(n, c, trained_metric_series(run, m)) for n, c, m in STALENESS_SHARES]
    shares = [s for s in shares if any(v is not None for v in s.values)]
    html = ""
    if any(v is not None for s in ages for v in s.values):
        caption = (
            "Token age = the trainer's policy version minus the version that sampled the token, over "
            "loss-masked-in tokens of valid samples (staleness/token_age_hist/*: each bucket's share of "
            "the tokens with a version; unversioned tokens are counted apart). One-step-off training "
            "puts every token at age 1; in-flight updates spread it."
        )
        columns = [trained_metric_series(run, metric) for _, metric in STALENESS_TABLE]
        rows = [
            (rid, *(number_or_na(column[position]) for column in columns))
            for position, rid in enumerate(categories)
            if any(column[position] is not None for column in columns)
        ]
        table = page.table(
            ("rollout step", *(name for name, _ in STALENESS_TABLE)),
            rows,
            (False, *[True] * len(STALENESS_TABLE)),
        )
        chart = bar_chart(categories, ages, x_label=STEP_AXIS, y_label="share of tokens", fmt=format_percent)
        html += page.section(
            "chart-staleness-age",
            "Staleness: token age per train step",
            caption,
            chart + legend(ages) + table,
        )
    if shares:
        caption = (
            "<b>mixed-version samples</b> (staleness/mixed_version_frac): valid samples whose trained "
            "tokens carry more than one version. <b>stale KV context</b> (kv/stale_prefix_tokens_frac): "
            "of the context positions each turn read (known KV versions), the share written by a policy "
            "older than the turn's first forward. <b>R3 rows from a later prefill</b> "
            "(r3/rows_from_later_prefill_frac): the share of trained tokens whose kept routing a later "
            "prefill recorded, split by whether the next turn read the token from the prefix cache."
        )
        chart = line_chart(categories, shares, x_label=STEP_AXIS, y_label="share", y_range=(0.0, 1.0))
        html += page.section(
            "chart-staleness-shares",
            "Staleness: version mix, stale KV, R3 provenance",
            caption,
            chart + legend(shares),
        )
    return html
