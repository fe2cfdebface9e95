"""Pass-rate drift: whether a task's pass rate moved, by a binomial test, not a raw difference.

Owns the Wilson score interval and the two comparisons the training-time tracker
(`rl360_ext.tasks.tracker`) makes per task:
- `drift`: the policy's recent pass rate against the task's own early-training baseline. Both
  are binomial proportions; the rate moved when their Wilson intervals at `z` do not overlap
  (a conservative two-sample test: at z = 2.576, disjoint 99% intervals). -1: it fell, +1: it
  rose, 0: no evidence of a change (including no attempts on either side);
- `above_ceiling`: the policy's pass rate against the audit's oracle (`passed` of `valid` oracle
  runs): the reference solution is the ceiling, so a policy whose Wilson lower bound is above the
  oracle's Wilson upper bound passes more often than the reference solution can (a hack, or an
  oracle that is wrong). With the audit's 3 of 3 the ceiling's upper bound is 1: never above.
Why the baseline is the task's own early pass rate, not the audit's: the audit is model-free, it
measures the oracle (about 1) and nop (about 0), which bound every policy, so a test against
them would flag every task at the first step. Learning raises pass rates, so an upward drift is
expected; a downward one (a task the policy passed and now fails) is the health signal, as is a
policy above its ceiling. Neither quarantines a task by itself (see the tracker).
"""

from __future__ import annotations

import math

DEFAULT_Z = 2.576  # two-sided 99%


def wilson_interval(passes: int, n: int, z: float = DEFAULT_Z) -> tuple[float, float]:
    """The Wilson score interval of `passes` of `n` at `z`; (0, 1) for no trials. A count outside
    0..n or a z that is not positive and finite is a ValueError naming it."""
    if n < 0 or not 0 <= passes <= max(n, 0):
        raise ValueError(f"passes must be in 0..n, got passes={passes}, n={n}")
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"z must be finite and > 0, got {z}")
    if n == 0:
        return 0.0, 1.0
    p = passes / n
    z2 = z * z
    denominator = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def drift(base_passes: int, base_n: int, recent_passes: int, recent_n: int, z: float = DEFAULT_Z) -> int:
    """-1 when the recent rate is significantly below the baseline, +1 above, else 0."""
    if base_n == 0 or recent_n == 0:
        return 0
    base_low, base_high = wilson_interval(base_passes, base_n, z)
    recent_low, recent_high = wilson_interval(recent_passes, recent_n, z)
    if recent_high < base_low:
        return -1
    if recent_low > base_high:
        return 1
    return 0


def above_ceiling(passes: int, n: int, oracle_passes: int, oracle_n: int, z: float = DEFAULT_Z) -> bool:
    """The policy passes significantly more often than the audit's oracle (both Wilson at `z`)."""
    if n == 0 or oracle_n == 0:
        return False
    return wilson_interval(passes, n, z)[0] > wilson_interval(oracle_passes, oracle_n, z)[1]
