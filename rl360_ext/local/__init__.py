"""Local tooling: one launcher of the local stack, the demo, the fault matrix, benches and task fixtures."""
