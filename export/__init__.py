"""Export: a trained run to ONNX (parity checked) and a Triton model repository version, and
triton_python_model/ (the code Triton runs). The learning loop that retrains and publishes is loop/."""
