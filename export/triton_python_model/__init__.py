"""The Triton Python-backend model (model.py), shipped as a file: never imported by the project.

`MODEL_PY` is the path that `routerkt export` copies verbatim into each python-backend version
folder; model.py itself only runs inside Triton's Python stub.
"""
from pathlib import Path

MODEL_PY = Path(__file__).with_name("model.py")
