"""The reference trainer: a CPU stand-in for Megatron that trains the tiny engine's model.

Only tests, benchmarks and the demo import it; production code never does.
"""
