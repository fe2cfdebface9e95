"""Local tooling, never imported by production code: the local stack's launcher (`stack`, `services`,
`engines`, `local_ray`), the task fixtures and their agents (`fixtures`), `rl360 demo` (`demo`), the
fault A/B (`ab`) and the benchmarks behind `rl360 bench` (`bench`)."""
