"""RouterKT Serving: the `routerkt` console script, the error type and the helpers shared by every package,
and contract/ (signature, vocabulary, model info: what training, export and serving agree on, torch-free)."""
__version__ = "0.1.0"
