"""RouterKT Serving: the `routerkt` console script and the error type shared by every package."""
__version__ = "0.1.0"
