"""The fault A/B: the offline one (`rl360 ab`: `offline`, `config`), the live one (`rl360 demo
--compare`: `compare`), their statistics (`stats`) and the comparison page (`page`)."""
