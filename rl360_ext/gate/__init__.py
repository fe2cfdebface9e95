"""The step gate: one trust verdict per step (train, skip the update, or stop the run) with its reasons."""
