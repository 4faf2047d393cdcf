"""Data layer: the canonical CSV reader, the vocabulary, the sequence/fold protocol and synthetic learners (numpy + pandas, no torch)."""
