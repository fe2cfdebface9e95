"""Benchmarks behind `rl360 bench`: each prints a table against a baseline measured in the same run."""
