"""Exit 0 when /app/answer.txt holds the prime's letter."""

import sys
from pathlib import Path

answer = Path("/app/answer.txt")
sys.exit(0 if answer.is_file() and answer.read_text().strip() == "C" else 1)
