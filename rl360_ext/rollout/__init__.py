"""Miles rollout-side hooks: agent function, generate, infra classifier, filter, rewards, metrics."""
