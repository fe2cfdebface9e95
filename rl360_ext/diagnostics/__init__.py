"""Diagnostics: the HTML step report with charts (`rl360 report`) and the machine check (`rl360 doctor`)."""
