"""Ground floor: process lifecycle and progress display, shared by every layer above."""
