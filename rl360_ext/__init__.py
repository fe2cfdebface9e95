"""rl360-ext: the code between Miles, SGLang, SMG and Harbor that decides whether a step's gradient
can be trusted. Subpackages by concern; see README.md and docs/."""

__version__ = "0.1.0"
