from pathlib import Path

assert Path("/app/sum.txt").read_text().strip() == "266"
