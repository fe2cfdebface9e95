"""Miles rollout-side hooks: agent function (and its Harbor routing), generate, filter, rewards,
metrics (occupancy, the audit of upstream defaults)."""
