"""Task health: controls that audit a task set before training, and the verdicts they give.

HTTP-agnostic: the audit (`rl360_ext.tasks.audit`) runs its controls through any `RunAttempt`
callable that returns a Harbor `/run` answer; `rl360_ext.tasks.client` is the HTTP one.
"""
