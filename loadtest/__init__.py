"""Benchmarks and load tests: bench/ holds one module per `routerkt bench <name>`, beside the parts they share."""
