"""Data layer: the canonical CSV reader, the sequence/fold protocol, the one pipeline from a run's
DataConfig to its vocabulary, sequences and folds, and synthetic learners (numpy + pandas, no torch)."""
