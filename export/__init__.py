"""Export: a trained run to ONNX (parity checked) and a Triton model repository version; retrain/ (the
learning loop's offline half, `routerkt retrain`) and triton_python_model/ (the code Triton runs)."""
