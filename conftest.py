"""Test-wide settings: a hypothesis profile that tolerates a loaded 2-core machine."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "rl360",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("rl360")
