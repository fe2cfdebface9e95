"""`rl360 demo`: the plan (`plan`, `modes`, `faults`, `arms`), the driver that runs it on the local
stack (`driver`, `stack`, `churn`), the reference trainer's side (`trainer`) and the step gate's
(`gate`)."""
