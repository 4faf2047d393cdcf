"""Evaluation and research on trained runs: leak audit, served protocol, validity, analysis, plots."""
