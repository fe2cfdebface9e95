"""Diagnostics: rollout audit, HTML step reports with charts, benchmarks."""
