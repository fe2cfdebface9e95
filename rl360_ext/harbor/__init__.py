"""The Harbor /run server (Python >= 3.12, the `harbor` extra): admission, deadlines, sandboxes."""
