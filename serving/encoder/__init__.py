"""The pipeline's Encoder part: raw platform ids -> the served graph's inputs (window.py: WindowEncoder)."""
