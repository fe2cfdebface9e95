from pathlib import Path

assert Path("/app/done.txt").read_text().strip() == "done"
