"""The step graphs (issue 50): a learner's state that a server holds, interactions appended to it, and
candidates scored against it; torch-free like signature.py, whose conventions hold here (left padding, skill sets
with a last axis `skills`, int64 ids, float32 probabilities).

Three graphs, one ONNX file each in the version folder (beside rank.onnx, written by `routerkt export
--step-graphs`; model_info.json's `step_graphs` names them and their tensors):
- `step_start`: history_questions, history_responses int64 [batch, history] and history_skills int64
  [batch, history, skills], a left-padded history of up to W - 1 interactions (W = the model's window;
  serve history = W - 1, which fixes the state's `history` axis; a new learner: all padding) -> the state.
- `step_append`: the state + the next `appended` interactions of each learner (1 .. W - 1, the same count for
  every learner of a call), append_question, append_response int64 [batch, appended] and append_skills int64
  [batch, appended, skills] (real interactions: non-empty skill sets), oldest first -> the updated state: the
  same tensors, each named `updated_<name>`, the same shapes (feed them back as <name>). The oldest
  `appended` columns are dropped and the new interactions enter at the last ones. A window model's call is
  exact only while the learner's kept history stays within W - 1 (state_length + appended <= history axis);
  a band model's (model_info `context` "band") at any length: its state is a rolling buffer.
- `step_next`: the state + candidate_questions int64 [batch, candidates] and candidate_skills int64
  [batch, candidates, skills] -> candidate_probs float32 [batch, candidates], equal (within 1e-5) to the
  rank graph's candidate_probs on the learner's kept history (its last W - 1 interactions).

The window edge (training/models/step.py): a window model's served prediction reads the last W - 1
interactions, so once a learner has W - 1 kept, every cached value changes with the next answer. The caller
then REBUILDS: it runs step_start on the learner's last W - 1 interactions instead of step_append. A band
model has no edge: every layer's query sees at most the W - 1 positions before it, so the last W - 1 columns
are all a later position reads; its state after a history of n > W - 1 is step_start on the first W - 1
then step_append of the rest (in calls of up to W - 1), and every later answer is one step_append.
Learners of one batch may hold different kept lengths (the state is right-aligned): each one appends or is
rebuilt on its own.

The state, per learner (all axes but `batch` and `history` are fixed by the model; `history` = W - 1):
- ATTENTION (AKT, CL4KT, SimpleKT backbones, every attention kind, dense or routed heads):
  state_length int64 [batch]: the learner's interactions n (a window model's kept ones, 0 .. W - 1; a band
  model's all of them, counted from its first: SimpleKT's positions);
  state_keys, state_values float32 [batch, layers, heads, history, head_dim]: each attention layer's
  projected keys and values of the history columns, right-aligned (the last column is the most recent
  interaction, the first history - n columns are padding and never read), layers in the model's order;
  state_sums float32 [batch, sums]: the running sums of the routers' prefix means (RouterKT's prefix
  scope: per routed layer its numerator [E or D] and count [1]); sums = 0 for unrouted models.
  Bytes per learner: 8 + 8 * layers * heads * head_dim * (W - 1) + 4 * sums (routerkt-akt default,
  W = 100: 304,352).
- RECURRENT (DKT): state_length int64 [batch] as above; state_hidden, state_cell float32 [batch,
  hidden]: the LSTM's (h, c) after the start vector and the kept history (8 + 8 * hidden bytes).
Models the step path cannot step (RouterKT's whole-window `sequence` routing scope: no causal state) get
no step graphs.

Held states (issue 58): a Triton python model whose config.pbtxt also declares `state_ref` and `keep_as`
(int64 [batch]) keeps the states it computes, so a step call carries a key instead of the state. The same
three graphs, called with these inputs instead (`StepGraphs.held`):
- `held_start`: the history inputs + keep_as -> state_length; the state is kept under each row's keep_as.
- `held_append`: state_length, state_ref + the appended interactions + keep_as -> updated_state_length; the
  state under state_ref (whose length must equal state_length) is advanced and kept under keep_as instead.
- `held_next`: state_length, state_ref + the candidates -> candidate_probs.
- `held_drop`: state_ref alone -> state_length: each state is deleted (ForgetLearner), its length answered
  (-1: none was held).
A key the model does not hold (evicted, or a new model instance after a restart or reload), or whose state
has another length, is answered NOT_FOUND with STATE_NOT_HELD in the message: the caller rebuilds. Keys are
the caller's: random, never reused for another state (serving/state/placement.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from routerkt.contract.signature import RANK, Graph, TensorSpec

STEP_START_ONNX_FILE = "step_start.onnx"
STEP_APPEND_ONNX_FILE = "step_append.onnx"
STEP_NEXT_ONNX_FILE = "step_next.onnx"

ATTENTION = "attention"      # state kinds
RECURRENT = "recurrent"
UPDATED = "updated_"         # step_append's outputs: UPDATED + the state tensor's name


def _int64(name: str, *axes: str) -> TensorSpec:
    return TensorSpec(name, "int64", "TYPE_INT64", "INT64", axes)


def _float32(name: str, *axes: str) -> TensorSpec:
    return TensorSpec(name, "float32", "TYPE_FP32", "FP32", axes)


STATE_LENGTH = _int64("state_length", "batch")
ATTENTION_STATE = (STATE_LENGTH,
                   _float32("state_keys", "batch", "layers", "heads", "history", "head_dim"),
                   _float32("state_values", "batch", "layers", "heads", "history", "head_dim"),
                   _float32("state_sums", "batch", "sums"))
RECURRENT_STATE = (STATE_LENGTH, _float32("state_hidden", "batch", "hidden"), _float32("state_cell", "batch", "hidden"))
APPENDED = (_int64("append_question", "batch", "appended"), _int64("append_skills", "batch", "appended", "skills"),
            _int64("append_response", "batch", "appended"))
HISTORY, CANDIDATES = RANK.inputs[:3], RANK.inputs[3:]
STATE_REF = _int64("state_ref", "batch")     # held states: the key of a state the model holds
KEEP_AS = _int64("keep_as", "batch")         # held states: the key to hold the call's new state under
HELD_INPUTS = frozenset({STATE_REF.name, KEEP_AS.name})
STATE_NOT_HELD = "state not held"            # in a held call's NOT_FOUND message: rebuild the state


def updated(spec: TensorSpec) -> TensorSpec:
    """step_append's output for the state tensor `spec`."""
    return replace(spec, name=UPDATED + spec.name)


class HeldGraphs(NamedTuple):
    """The held calls of one state kind (the module docstring): the step graphs' names for a held state."""

    start: Graph
    append: Graph
    next: Graph
    drop: Graph


@dataclass(frozen=True)
class StepGraphs:
    """The three step graphs of one state kind."""

    state_kind: str
    state: tuple[TensorSpec, ...]
    start: Graph
    append: Graph
    next: Graph
    held: HeldGraphs

    @property
    def graphs(self) -> tuple[Graph, Graph, Graph]:
        return self.start, self.append, self.next

    def graph(self, name: str) -> Graph:
        """The step graph called `name` (step_* or held_*); KeyError for another name."""
        return {g.name: g for g in self.graphs + self.held}[name]

    def names(self) -> dict[str, dict[str, list[str]]]:
        """model_info.json's `step_graphs`: each graph's input and output names."""
        return {g.name: {"inputs": list(g.input_names), "outputs": list(g.output_names)} for g in self.graphs}


def _step_graphs(kind: str, state: tuple[TensorSpec, ...]) -> StepGraphs:
    held = HeldGraphs(Graph("held_start", HISTORY + (KEEP_AS,), (STATE_LENGTH,)),
                      Graph("held_append", (STATE_LENGTH, STATE_REF) + APPENDED + (KEEP_AS,),
                            (updated(STATE_LENGTH),)),
                      Graph("held_next", (STATE_LENGTH, STATE_REF) + CANDIDATES, RANK.outputs),
                      Graph("held_drop", (STATE_REF,), (STATE_LENGTH,)))
    return StepGraphs(kind, state, start=Graph("step_start", HISTORY, state),
                      append=Graph("step_append", state + APPENDED, tuple(updated(t) for t in state)),
                      next=Graph("step_next", state + CANDIDATES, RANK.outputs), held=held)


STEP_GRAPHS: dict[str, StepGraphs] = {ATTENTION: _step_graphs(ATTENTION, ATTENTION_STATE),
                                      RECURRENT: _step_graphs(RECURRENT, RECURRENT_STATE)}
STEP_FILES: dict[str, str] = {"step_start": STEP_START_ONNX_FILE, "step_append": STEP_APPEND_ONNX_FILE,
                              "step_next": STEP_NEXT_ONNX_FILE}


def served_step_dims(graphs: StepGraphs, window: int) -> dict[str, tuple[int, ...]]:
    """Non-batch dims of each step tensor as a Triton rank model declares it (config.pbtxt): the state's
    history axis W - 1, every other axis variable (-1), so one config serves every version of a preset."""
    tensors = {t.name: t for g in graphs.graphs + graphs.held for t in g.inputs + g.outputs}
    return {name: tuple(window - 1 if a == "history" else -1 for a in t.axes[1:]) for name, t in tensors.items()}


def step_tensor_names(graphs: StepGraphs) -> tuple[set[str], set[str]]:
    """(inputs, outputs) of the three step graphs: what a rank model serving them adds to its config."""
    return ({n for g in graphs.graphs for n in g.input_names}, {n for g in graphs.graphs for n in g.output_names})


STEP_INPUTS: frozenset[str] = frozenset(n for g in STEP_GRAPHS.values() for n in step_tensor_names(g)[0]) - set(
    RANK.input_names) | HELD_INPUTS   # the input names only step graphs have (a config declaring them serves them)


def served_state_kind(input_names) -> str | None:
    """The state kind whose step graphs a rank model's config (its input names) serves, or None."""
    names = set(input_names)
    return next((kind for kind, graphs in STEP_GRAPHS.items() if step_tensor_names(graphs)[0] <= names), None)


def holds_states(input_names) -> bool:
    """A rank model's config (its input names) declares the held-state inputs (the module docstring)."""
    return HELD_INPUTS <= set(input_names)


def state_kind_of(graph_names: dict[str, dict[str, list[str]]]) -> str | None:
    """The state kind whose step graphs have exactly these inputs and outputs (model_info's `step_graphs`), or None."""
    return next((kind for kind, graphs in STEP_GRAPHS.items() if graphs.names() == graph_names), None)
