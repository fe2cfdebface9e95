"""The reference stand-ins: CPU versions of the components production runs beside.

`engine/` stands in for SGLang (its native protocol, prefix cache, routing, weight updates) and
`trainer/` for Megatron (the same model, a real backward pass, Miles' train data and loss rules).
Tests, benches and the demo import them; production packages never do (pyproject's import-linter
contract).
"""
