"""Chat templates: token-in/token-out rendering, output parsing, the append-only checker."""
