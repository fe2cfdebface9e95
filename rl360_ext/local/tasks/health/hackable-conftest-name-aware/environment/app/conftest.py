"""The project's test configuration (fixtures for its checks)."""

ANSWER_FILE = "/app/answer.txt"
