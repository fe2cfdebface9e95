"""The tiny reference engine: a CPU stand-in for SGLang speaking its native protocol.

Only tests, benchmarks and the demo import it; production code never does.
"""
