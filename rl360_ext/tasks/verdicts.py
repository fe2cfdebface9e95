"""The task-health vocabulary, once: each verdict the audit gives and each control that gives it.

Owns `TaskVerdict` (the issue's words exactly: a task with no finding is `ok`; `slow_verifier` is
given during training only, by `rl360_ext.tasks.tracker`) and `Control`
(the checks the audit runs, each with the agent that drives it). Deciding is
`rl360_ext.tasks.audit`; whether an attempt's reward counts is `rl360_ext.outcomes.verdict`.
"""

from __future__ import annotations

from enum import StrEnum

from rl360_ext.outcomes.harbor_exceptions import VERIFIER_DISAGREED_ERROR


class TaskVerdict(StrEnum):
    """One finding about a task; its value is the string in every output."""

    LINT = "lint"  # Harbor refused to load the task (the server's task_invalid)
    BROKEN_ENV = "broken_env"  # the environment does not start
    BROKEN_ORACLE = "broken_oracle"  # the oracle reached the maximum reward in 0 of N runs
    FLAKY = "flaky"  # the oracle reached it in some of N runs
    VACUOUS = "vacuous"  # doing nothing scores above the floor (in training: the signature, K times)
    FLAKY_VERIFIER = "flaky_verifier"  # the verifier re-run on the same end state disagrees
    INSENSITIVE = "insensitive"  # the oracle's work removed still scores the maximum
    HACKABLE = "hackable"  # a canary hack with no model scores the maximum
    LEAKY = "leaky"  # the answer is readable from where the agent runs
    SLOW_ORACLE = "slow_oracle"  # the oracle takes over half the agent budget
    # Given during training only (rl360_ext.tasks.tracker), from the policy's own attempts:
    SLOW_VERIFIER = "slow_verifier"  # the verifier's p95 reached its timeout
    OK = "ok"  # no finding


class Control(StrEnum):
    """One control the audit runs; its value is its key in a task's evidence."""

    LINT = "lint"
    ENVIRONMENT = "environment"
    ORACLE = "oracle"
    NOP = "nop"
    CANARY_REWARD_FILE = "canary_reward_file"
    CANARY_PATH_SHIMS = "canary_path_shims"
    PROBE_LEAKS = "probe_leaks"
    CANARY_CONFTEST = "canary_conftest"
    INSENSITIVE = "insensitive"
    VERIFIER_REGRADE = "verifier_regrade"
    WORK_PRODUCT_HIJACK = "work_product_hijack"


# The /run agent name each control runs (the server's agent table must list it).
CONTROL_AGENTS: dict[Control, str] = {
    Control.ENVIRONMENT: "nop",
    Control.ORACLE: "oracle",
    Control.NOP: "rl360-idle",
    Control.CANARY_REWARD_FILE: "rl360-canary-reward-file",
    Control.CANARY_PATH_SHIMS: "rl360-canary-path-shims",
    Control.PROBE_LEAKS: "rl360-probe-leaks",
    Control.CANARY_CONFTEST: "rl360-canary-conftest",
    Control.INSENSITIVE: "rl360-canary-insensitive",
    Control.VERIFIER_REGRADE: "rl360-oracle-regrade",
    Control.WORK_PRODUCT_HIJACK: "rl360-canary-hijack",
}
# The nop control's agent on a server that does not run rl360's idle agent (no pause: the nop
# control is then not timed like a policy, which the evidence's `nop.paused` says).
NOP_FALLBACK_AGENT = "nop"
# The canary controls and the verdict each gives when it scores the maximum. Their agents are
# rl360's (`rl360_ext.harbor.canaries`), given the maximum reward as the `reward` agent kwarg.
CANARY_VERDICTS: dict[Control, TaskVerdict] = {
    Control.CANARY_REWARD_FILE: TaskVerdict.HACKABLE,
    Control.CANARY_PATH_SHIMS: TaskVerdict.HACKABLE,
    Control.PROBE_LEAKS: TaskVerdict.LEAKY,
    Control.CANARY_CONFTEST: TaskVerdict.HACKABLE,
    Control.INSENSITIVE: TaskVerdict.INSENSITIVE,
    Control.WORK_PRODUCT_HIJACK: TaskVerdict.HACKABLE,
}
# Controls run more than once, one attempt per entry (extra agent kwargs): the hijack's Python
# stubs (`rl360_ext.harbor.canaries.PYTHON_STUBS`: `os._exit(0)`, `raise SystemExit(0)`).
CONTROL_VARIANTS: dict[Control, tuple[dict[str, str], ...]] = {
    Control.WORK_PRODUCT_HIJACK: ({"stub": "exit"}, {"stub": "raise"}),
}
# The regrade control's agent (the oracle, then the verifier `runs` times on its end state) ends
# with this exception type when the gradings differ: the flaky_verifier finding.
VERIFIER_DISAGREED = VERIFIER_DISAGREED_ERROR
