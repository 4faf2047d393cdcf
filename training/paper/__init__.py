"""The paper's comparison: the grid of variants, resumable runs, RESULTS.md with the published numbers."""
