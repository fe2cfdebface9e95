"""The production SGLang / SMG client and its protocol types (token-in, routed experts, weight spans)."""
