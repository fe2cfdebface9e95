"""Weight pushes: planning and observing which path a push took and what it cost."""
