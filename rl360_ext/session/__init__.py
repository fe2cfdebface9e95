"""The delta-R3 session server: token-in/token-out chat sessions, merged samples, a Ray pool."""
