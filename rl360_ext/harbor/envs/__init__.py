"""Harbor environments rl360 provides: sandboxes that need no container engine (`bwrap`)."""
