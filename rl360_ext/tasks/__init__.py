"""Task health: controls that audit a task set before training, the verdicts they give, and what
the policy's own attempts say about each task during training.

HTTP-agnostic: the audit (`rl360_ext.tasks.audit`) runs its controls through any `RunAttempt`
callable that returns a Harbor `/run` answer; `rl360_ext.tasks.client` is the HTTP one. During
training, `rl360_ext.tasks.signals` reads one step, `rl360_ext.tasks.tracker` accumulates across
steps and keeps the live quarantine list, with `rl360_ext.tasks.drift`'s binomial tests.
"""
