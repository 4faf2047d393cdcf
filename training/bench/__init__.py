"""Training-side benchmarks: training throughput, the step path, data-parallel speed-up, fidelity A/B."""
