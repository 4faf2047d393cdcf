"""The inference signature: named graphs with their tensor names, dtypes and shapes, shared by the
ONNX exporter, the Triton config renderer, the Triton python-backend model and the gateway. It is
the one place these facts live; nothing here imports torch.

Conventions (identical in training, offline evaluation and serving):
- Ids are the re-indexed vocabulary ids: PAD_ID 0 = padding, UNK_ID 1 = unknown, real ids start
  at FIRST_ID 2 (routerkt/contract/vocab.py).
- Sequences are LEFT-padded: the most recent interaction sits at the last index (L-1). Padding
  positions hold question = PAD_ID, every skill slot PAD_ID and response PAD_RESPONSE (-1; the
  model clamps).
- An interaction has a SET of skills: every skill tensor has a last axis `skills` (K >= 1) holding
  the set's skill ids, unused slots PAD_ID; the model embeds the set as the mean of its skills'
  embeddings (a set of one skill embeds exactly as that skill). In raw (platform) ids a set is a
  row of K raw ids with NO_SKILL (-2) in unused slots; raw -1 = a skill the platform does not know.
- The gateway puts a candidate question at index L-1 with response CANDIDATE_RESPONSE; a causal
  model never reads it.

Graphs (one ONNX file per graph in a model version folder):
- `score`: questions, responses int64 [batch, seq] and skills int64 [batch, seq, skills] -> probs
  float32 [batch, seq], where
  probs[b, t] = P(correct at t | questions <= t, responses < t). Whole-sequence scoring for
  evaluation; the gateway reads probs[:, -1].
- `rank`: history_questions, history_responses int64 [batch, history], history_skills int64
  [batch, history, skills], candidate_questions int64 [batch, candidates] and candidate_skills
  int64 [batch, candidates, skills] -> candidate_probs float32
  [batch, candidates]. The history is left-padded like a window without its last slot (history =
  window - 1 in serving; any length up to window - 1 is accepted); candidate_probs[b, j] equals
  probs[b, -1] of the score graph on the window [history_b, candidate_j] (tolerance 1e-5), from one
  forward over history + candidates. Padding candidates (PAD_ID) get a meaningless value.
- `explain`: the rank graph's inputs -> candidate_probs as rank, plus explain_attention float32
  [batch, candidates, heads, history] (the knowledge retriever's last layer: each head's attention
  from candidate j to each history position; rows sum to <= 1, 0 on padding) and
  explain_head_weights float32 [batch, candidates, heads] (that layer's weight of each head at the
  candidate: RouterKT's shared heads 1, selected dynamic heads their routing weight, others 0;
  dense heads all 1). Attention-free models (DKT) have no explain graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD_ID = 0                 # question / skill id of a padding position
UNK_ID = 1                 # id of every question or skill the vocabulary does not know (and raw -1)
FIRST_ID = 2               # the first id of a real question or skill
PAD_RESPONSE = -1          # response value at padding positions
CANDIDATE_RESPONSE = 0     # response value at a candidate's slot; never read by a causal model
NO_SKILL = -2              # raw skill id of an unused slot of a skill set (raw -1 = unknown skill)

# Files inside a model version folder of the Triton repository.
ONNX_FILE = "model.onnx"
RANK_ONNX_FILE = "rank.onnx"     # the rank graph, next to model.onnx
EXPLAIN_ONNX_FILE = "explain.onnx"   # the explain graph (absent: a version exported before it)
PLAN_FILE = "model.plan"
VOCAB_FILE = "vocab.json"        # routerkt/contract/vocab.py
INFO_FILE = "model_info.json"    # routerkt/contract/model_info.py
CONFIG_FILE = "config.pbtxt"     # per model, next to its version folders


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str                 # numpy dtype name
    triton_dtype: str          # Triton config data_type
    onnx_dtype: str            # ONNX / tritonclient datatype string
    axes: tuple[str, ...]      # symbolic axes, every one dynamic in ONNX


@dataclass(frozen=True)
class Graph:
    """One exported graph: its inputs and outputs, in order."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


def _int64(name: str, length: str = "seq") -> TensorSpec:
    return TensorSpec(name, "int64", "TYPE_INT64", "INT64", ("batch", length))


def _skill_sets(name: str, length: str = "seq") -> TensorSpec:
    return TensorSpec(name, "int64", "TYPE_INT64", "INT64", ("batch", length, "skills"))


SCORE = Graph(
    name="score",
    inputs=(_int64("questions"), _skill_sets("skills"), _int64("responses")),
    outputs=(TensorSpec("probs", "float32", "TYPE_FP32", "FP32", ("batch", "seq")),),
)
PROBS = SCORE.outputs[0].name      # the probability output of the score graph

RANK = Graph(
    name="rank",
    inputs=(_int64("history_questions", "history"), _skill_sets("history_skills", "history"),
            _int64("history_responses", "history"),
            _int64("candidate_questions", "candidates"), _skill_sets("candidate_skills", "candidates")),
    outputs=(TensorSpec("candidate_probs", "float32", "TYPE_FP32", "FP32", ("batch", "candidates")),),
)
CANDIDATE_PROBS = RANK.outputs[0].name   # the probability output of the rank graph

EXPLAIN = Graph(           # the rank graph plus the knowledge retriever's last attention layer (docs/api.md, "explain")
    name="explain",
    inputs=RANK.inputs,
    outputs=(RANK.outputs[0],
             TensorSpec("explain_attention", "float32", "TYPE_FP32", "FP32",
                        ("batch", "candidates", "heads", "history")),
             TensorSpec("explain_head_weights", "float32", "TYPE_FP32", "FP32", ("batch", "candidates", "heads"))),
)
EXPLAIN_ATTENTION, EXPLAIN_HEAD_WEIGHTS = (t.name for t in EXPLAIN.outputs[1:])

# RANK before EXPLAIN: graph_with_inputs (same inputs) names a config's inputs the rank graph
GRAPHS: dict[str, Graph] = {SCORE.name: SCORE, RANK.name: RANK, EXPLAIN.name: EXPLAIN}


def served_dims(graph: Graph, window: int) -> dict[str, tuple[int, ...]]:
    """Non-batch dims of each tensor of `graph` as Triton serves it for a model of `window`:
    score [window]; rank history [window - 1], candidates [-1] (variable); skills [-1] (variable)."""
    axis = {"seq": window, "history": window - 1, "candidates": -1, "skills": -1, "heads": -1}
    return {t.name: tuple(axis[a] for a in t.axes[1:]) for t in graph.inputs + graph.outputs}


def zero_inputs(graph: Graph, window: int) -> dict[str, np.ndarray]:
    """One request of padding only (batch 1, a variable axis of length 1): warm-up and probes."""
    dims = served_dims(graph, window)
    return {t.name: np.zeros((1, *(d if d > 0 else 1 for d in dims[t.name])), dtype=np.int64) for t in graph.inputs}


def graph_with_inputs(names) -> Graph | None:
    """The graph whose input names are exactly `names` (in any order), or None."""
    wanted = set(names)
    return next((g for g in GRAPHS.values() if set(g.input_names) == wanted), None)


def skill_axis(spec: TensorSpec) -> bool:
    """True for a tensor that carries skill sets (its last axis is `skills`)."""
    return spec.axes[-1] == "skills"
