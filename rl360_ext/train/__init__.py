"""Miles train-side hooks: loss reducers and valid-only TIS / mismatch metrics (no torch import)."""
