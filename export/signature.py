"""The one inference signature: tensor names, dtypes and shapes shared by the ONNX exporter, the
Triton config renderer, the Triton Python-backend model and the gateway. No torch import here.

Conventions (identical in training, offline evaluation and serving):
- Ids are the re-indexed vocabulary ids: 0 = padding, 1 = unknown, real ids start at 2.
- Sequences are LEFT-padded: the most recent interaction sits at the last index (L-1). The gateway
  puts the candidate question at index L-1; its response value there is ignored by the model
  (exact causality), so it is sent as 0.
- `responses` holds 0/1 for real positions; padding positions may hold 0 or -1 (the model clamps).
- `probs[b, t]` is P(correct at position t | questions <= t, responses < t). The gateway reads
  `probs[:, -1]`.
"""
from __future__ import annotations

from dataclasses import dataclass

PAD_ID = 0
UNK_ID = 1
FIRST_ID = 2
CANDIDATE_RESPONSE = 0     # response value at the candidate's slot (index L-1); never read by a causal model


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str                 # numpy dtype name
    triton_dtype: str          # Triton config data_type
    onnx_dtype: str            # ONNX / tritonclient datatype string
    axes: tuple[str, ...]      # symbolic axes; "batch" and "seq" are dynamic in ONNX


INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("questions", "int64", "TYPE_INT64", "INT64", ("batch", "seq")),
    TensorSpec("skills", "int64", "TYPE_INT64", "INT64", ("batch", "seq")),
    TensorSpec("responses", "int64", "TYPE_INT64", "INT64", ("batch", "seq")),
)
OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("probs", "float32", "TYPE_FP32", "FP32", ("batch", "seq")),
)
INPUT_NAMES = tuple(t.name for t in INPUTS)
OUTPUT_NAMES = tuple(t.name for t in OUTPUTS)
PROBS = OUTPUTS[0].name

# Files inside a model version folder of the Triton repository.
ONNX_FILE = "model.onnx"
PLAN_FILE = "model.plan"
VOCAB_FILE = "vocab.json"
INFO_FILE = "model_info.json"   # preset, window, vocabulary sizes, provenance (run id, git sha, AUC)


def spec(name: str) -> TensorSpec:
    for t in INPUTS + OUTPUTS:
        if t.name == name:
            return t
    raise KeyError(name)
