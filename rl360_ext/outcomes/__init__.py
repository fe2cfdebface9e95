"""The outcome vocabulary: failure causes, reward provenance and the verdict on whether a reward counts."""
