"""Inference backends (serving/parts.py: InferenceBackend): `triton.py`, the production path to a
Triton server; `onnxruntime.py`, the same ONNX files in-process, for development and for tests of
the code around the backend (never instead of the e2e tests with a real Triton)."""
