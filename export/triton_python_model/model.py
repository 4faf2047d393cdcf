"""Triton Python-backend model: runs one exported graph (model.onnx: score, or rank.onnx: rank; the
config parameter GRAPH says which) with onnxruntime on CPU. A rank model whose version folder holds the step
graphs (step_start/step_append/step_next.onnx) and whose config.pbtxt declares their tensors (every input
optional) also serves them: a request's inputs say which graph it is for (the gateway's learner states,
sent with each request and answered with the new state). With config parameter HELD_STATE_BYTES it also keeps
the states it computes, least recently used out first (the held calls of routerkt/contract/step_signature.py:
a request names a state by `state_ref` and keeps its new one under `keep_as`; a key not held is answered
NOT_FOUND, and the gateway rebuilds; a request of `state_ref` alone deletes those states: ForgetLearner). A rank model whose version folder also
holds explain.onnx (the explain graph: the rank graph's inputs and candidate_probs plus the attention
outputs) runs it instead of rank.onnx for the requests that ask for an explain output; the others
(and every request of a version without explain.onnx) run rank.onnx alone, as before. The id bounds
(valid question and skill ids) come from the version folder's model_info.json, and from the config
parameters N_QUESTIONS / N_SKILLS only when it lacks them: one config.pbtxt serves versions of
different vocabularies, so a retrain whose vocabulary grew leaves it unchanged.

Copied verbatim into every version folder of a python-backend model by `routerkt export`, with
routerkt_held_states.py (the held states) and routerkt_version_setup.py (what an instance reads as it starts)
beside it: the python backend puts the version folder on sys.path. It runs inside Triton's
`triton_python_backend_stub` with the project venv's interpreter, so it imports only numpy, onnxruntime,
the standard library, `triton_python_backend_utils` and those two files, never the project.
The tensor names below mirror routerkt/contract/signature.py (a unit test keeps them equal).

Triton 2.51 facts this file is written around (docs/operations.md, "Triton 2.51"):
- the python backend does NOT merge a dynamic batch: `execute` gets a list of requests and must
  concatenate / split them itself;
- one exception in `execute` fails every request of the batch, so each request is validated on its
  own and gets its own error;
- a request whose client deadline expired while queued still arrives here: check `is_cancelled()`;
- `pb_utils.Tensor.from_dlpack` on a numpy array kills the stub: outputs use `pb_utils.Tensor`.
"""
import json
import os
import time

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from routerkt_held_states import HeldStates, held_gauges
from routerkt_version_setup import checked_session, exec_histogram, id_bounds, session_options, version_info

# Mirrors routerkt/contract/signature.py: the score graph (SCORE, ONNX_FILE) ...
QUESTIONS = "questions"
SKILLS = "skills"
RESPONSES = "responses"
INPUT_NAMES = (QUESTIONS, SKILLS, RESPONSES)
PROBS = "probs"
ONNX_FILE = "model.onnx"
# ... and the rank graph (RANK, RANK_ONNX_FILE): one history row and N candidates per request row.
HISTORY_QUESTIONS = "history_questions"
HISTORY_SKILLS = "history_skills"
HISTORY_RESPONSES = "history_responses"
CANDIDATE_QUESTIONS = "candidate_questions"
CANDIDATE_SKILLS = "candidate_skills"
RANK_INPUT_NAMES = (HISTORY_QUESTIONS, HISTORY_SKILLS, HISTORY_RESPONSES, CANDIDATE_QUESTIONS, CANDIDATE_SKILLS)
CANDIDATE_PROBS = "candidate_probs"
RANK_ONNX_FILE = "rank.onnx"
GRAPHS = {"score": (INPUT_NAMES, PROBS, ONNX_FILE), "rank": (RANK_INPUT_NAMES, CANDIDATE_PROBS, RANK_ONNX_FILE)}
# ... and the explain graph (EXPLAIN, EXPLAIN_ONNX_FILE): the rank graph's inputs, candidate_probs and these.
EXPLAIN_ATTENTION = "explain_attention"          # float32 [B, N, heads, H]
EXPLAIN_HEAD_WEIGHTS = "explain_head_weights"    # float32 [B, N, heads]
EXPLAIN_OUTPUTS = (CANDIDATE_PROBS, EXPLAIN_ATTENTION, EXPLAIN_HEAD_WEIGHTS)
EXPLAIN_ONNX_FILE = "explain.onnx"
SKILL_INPUTS = (SKILLS, HISTORY_SKILLS, CANDIDATE_SKILLS)   # [batch, length, K]: a skill set per interaction
# ... and the step graphs (routerkt/contract/step_signature.py): picked by the inputs a request carries.
STEP_START, STEP_APPEND, STEP_NEXT = "step_start", "step_append", "step_next"
HELD_DROP = "held_drop"                          # state_ref alone: delete the states (ForgetLearner)
STEP_ONNX_FILES = {STEP_START: "step_start.onnx", STEP_APPEND: "step_append.onnx", STEP_NEXT: "step_next.onnx"}
STATE_LENGTH = "state_length"                    # int64 [batch]: a step request's state carries it
APPEND_QUESTION, APPEND_SKILLS, APPEND_RESPONSE = "append_question", "append_skills", "append_response"
STATE_REF = "state_ref"                         # held states: int64 [batch] keys
KEEP_AS = "keep_as"
UPDATED = "updated_"                             # step_append's outputs: UPDATED + the state tensor's name
STATE_NOT_HELD = "state not held"                # in a NOT_FOUND answer: the caller rebuilds the state
PADDED_LAST = SKILL_INPUTS + (APPEND_SKILLS,)    # padded on their last axis (PAD_ID 0) to batch requests
ID_LIMITS = {HISTORY_QUESTIONS: "questions", CANDIDATE_QUESTIONS: "questions", APPEND_QUESTION: "questions",
             HISTORY_SKILLS: "skills", CANDIDATE_SKILLS: "skills", APPEND_SKILLS: "skills"}
RESPONSE_INPUTS = (HISTORY_RESPONSES, APPEND_RESPONSE)
ORT_DTYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32}

# Parameter keys of config.pbtxt (mirrors export/triton_config.py; the others: routerkt_version_setup.py).
PARAM_WINDOW = "WINDOW"
PARAM_GRAPH = "GRAPH"
PARAM_HELD_STATE_BYTES = "HELD_STATE_BYTES"


class TritonPythonModel:
    """One instance per Triton model instance (instance_group count)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.model_name = args["model_name"]
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.n_questions, self.n_skills = id_bounds(pb_utils, folder, params)
        self.band = version_info(folder).get("context") == "band"      # a band model's state_length has no bound
        self.window = int(params[PARAM_WINDOW]) if params.get(PARAM_WINDOW, "").isdigit() else None
        self.graph = params.get(PARAM_GRAPH, "") or "score"
        if self.graph not in GRAPHS:
            raise pb_utils.TritonModelException(f"config.pbtxt parameter {PARAM_GRAPH} must be one of "
                                                f"{sorted(GRAPHS)}, got {self.graph!r}")
        self.input_names, self.output_name, onnx_file = GRAPHS[self.graph]

        options = session_options(params)
        self.session = checked_session(pb_utils, os.path.join(folder, onnx_file), options, self.input_names,
                                       (self.output_name,))
        explain = os.path.join(folder, EXPLAIN_ONNX_FILE)
        self.explain_session = (checked_session(pb_utils, explain, options, RANK_INPUT_NAMES, EXPLAIN_OUTPUTS)
                                if self.graph == "rank" and os.path.isfile(explain) else None)
        steps = {k: os.path.join(folder, f) for k, f in STEP_ONNX_FILES.items()}
        served = self.graph == "rank" and all(os.path.isfile(p) for p in steps.values())
        self.steps = {k: ort.InferenceSession(p, options, providers=["CPUExecutionProvider"])
                      for k, p in steps.items()} if served else {}
        budget = params.get(PARAM_HELD_STATE_BYTES, "")
        self.held = HeldStates(int(budget)) if served and budget.isdigit() and int(budget) > 0 else None
        self.held_gauges = held_gauges(pb_utils, self.model_name, args["model_version"]) if self.held else []
        # The family must stay referenced as long as its metric: dropping it unregisters the metric.
        self.exec_family, self.exec_seconds = exec_histogram(pb_utils, self.model_name, args["model_version"])

    def execute(self, requests):
        responses = [None] * len(requests)
        groups = {}                                # (graph, fixed shapes) -> ([request index], [feeds])
        for i, request in enumerate(requests):
            if request.is_cancelled():
                responses[i] = _error("request cancelled", pb_utils.TritonError.CANCELLED)
                continue
            kind = self._kind(request)
            if kind == HELD_DROP:
                responses[i] = self._drop(request)
                continue
            arrays, problem = self._read_step(request, kind) if kind in STEP_ONNX_FILES else self._read(request)
            if problem is not None:
                code = pb_utils.TritonError.INVALID_ARG
                if problem.startswith(STATE_NOT_HELD):
                    code = getattr(pb_utils.TritonError, "NOT_FOUND", pb_utils.TritonError.INTERNAL)
                responses[i] = _error(problem, code)
                continue
            # a version without explain.onnx answers candidate_probs alone, as before (the gateway never asks
            # it; Triton's warm-up and clients that name no outputs ask for every output of config.pbtxt)
            if kind == self.graph and self.explain_session is not None and _wants_explain(request):
                kind = "explain"
            fixed = tuple((n, a.shape[1:]) for n, a in sorted(arrays.items())
                          if n not in PADDED_LAST + (CANDIDATE_QUESTIONS,)) if kind in STEP_ONNX_FILES else ()
            group = groups.setdefault((kind, fixed), ([], []))
            group[0].append(i)
            group[1].append(arrays)
        for (kind, _), (good, feeds) in groups.items():
            if kind in STEP_ONNX_FILES:
                session = self.steps[kind]
                inputs, outputs = [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]
            else:
                session, inputs = (self.explain_session, RANK_INPUT_NAMES) if kind == "explain" else (
                    self.session, self.input_names)
                outputs = EXPLAIN_OUTPUTS if kind == "explain" else (self.output_name,)
            self._run(session, inputs, outputs, good, feeds, responses)
        for gauge, value in zip(self.held_gauges[1:], (len(self.held.states), self.held.nbytes) if self.held else ()):
            gauge.set(value)
        return responses

    def _kind(self, request):
        """Which graph a request is for: a step graph by the inputs only it has, else the config's graph."""
        if not self.steps:                         # a score model, or a rank version without step graphs
            return self.graph
        has = lambda name: pb_utils.get_input_tensor_by_name(request, name) is not None   # noqa: E731
        if has(APPEND_QUESTION):
            return STEP_APPEND
        if has(STATE_LENGTH):
            return STEP_NEXT
        if has(STATE_REF):
            return HELD_DROP
        return self.graph if has(CANDIDATE_QUESTIONS) else STEP_START

    def _drop(self, request):
        """Delete the states named by a request of `state_ref` alone: their lengths (-1: not held)."""
        refs = pb_utils.get_input_tensor_by_name(request, STATE_REF).as_numpy().reshape(-1)
        if self.held is None or refs.dtype != np.int64:
            return _error(f"input '{STATE_REF}' must be INT64 [batch] of a model that keeps states",
                          pb_utils.TritonError.INVALID_ARG)
        lengths = np.array([self.held.drop(ref) for ref in refs.tolist()], dtype=np.int64)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(STATE_LENGTH, lengths)])

    def _run(self, session, input_names, output_names, good, feeds, responses):
        """One onnxruntime run over the requests `good` (their validated `feeds`): every request's
        outputs `output_names` (candidate axis cut back to its own width) into `responses`."""
        widths = [f[CANDIDATE_QUESTIONS].shape[1] if CANDIDATE_QUESTIONS in f else None for f in feeds]
        if widths[0] is not None:                  # pad every request's candidates to the widest one
            width = max(widths)
            for f in feeds:
                for name in (CANDIDATE_QUESTIONS, CANDIDATE_SKILLS):
                    pad = [(0, 0), (0, width - f[name].shape[1])] + [(0, 0)] * (f[name].ndim - 2)
                    f[name] = np.pad(f[name], pad)   # PAD_ID 0
        if len(feeds) > 1:                         # pad every request's skill sets to the largest one
            k = max(f[name].shape[-1] for f in feeds for name in PADDED_LAST if name in f)
            for f in feeds:
                for name in PADDED_LAST:
                    if name in f and f[name].shape[-1] < k:
                        f[name] = np.pad(f[name], [(0, 0)] * (f[name].ndim - 1) + [(0, k - f[name].shape[-1])])
        batch = {name: np.concatenate([f[name] for f in feeds]) if len(feeds) > 1 else feeds[0][name]
                 for name in input_names}          # int64 [B, L] (rank: [B, H] and [B, N]; step: the state too)
        started = time.perf_counter()
        try:
            outputs = session.run(list(output_names), batch)   # float32 [B, L] (rank: [B, N], ...)
        except Exception:                          # ORT errors carry paths: answer generically
            for i in good:
                responses[i] = _error("model execution failed", pb_utils.TritonError.INTERNAL)
            return
        if self.exec_seconds is not None:
            self.exec_seconds.observe(time.perf_counter() - started)

        offset = 0
        for i, arrays, width in zip(good, feeds, widths):
            rows = arrays[input_names[0]].shape[0]
            named = zip(output_names, outputs)
            if KEEP_AS in arrays:                  # a held call: keep the new states, answer their lengths
                self.held.keep(arrays[KEEP_AS], {n[len(UPDATED):] if n.startswith(UPDATED) else n: o
                                                 for n, o in zip(output_names, outputs)}, offset)
                if STATE_REF in arrays:
                    self.held.release(arrays[STATE_REF])
                named = [(n, o) for n, o in zip(output_names, outputs) if n.endswith(STATE_LENGTH)]
            tensors = [pb_utils.Tensor(name, np.ascontiguousarray(o[offset:offset + rows, :width] if o.ndim > 1
                                                                  else o[offset:offset + rows]))
                       for name, o in named]
            offset += rows
            responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)

    def _read(self, request):
        return self._read_rank(request) if self.graph == "rank" else self._read_score(request)

    def _read_rank(self, request):
        """The five int64 inputs of one rank request ([b, H] history, [b, N] candidates; skills with
        a last axis K), or (None, message) when invalid."""
        arrays = {}
        for name in RANK_INPUT_NAMES:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                return None, f"missing input '{name}'"
            arrays[name] = tensor.as_numpy()
            rank = 3 if name in SKILL_INPUTS else 2
            if arrays[name].ndim != rank or arrays[name].dtype != np.int64:
                return None, (f"input '{name}' must be INT64 [batch, length{', skills' if rank == 3 else ''}], "
                              f"got {arrays[name].dtype} {list(arrays[name].shape)}")
        history, candidates = arrays[HISTORY_QUESTIONS].shape, arrays[CANDIDATE_QUESTIONS].shape
        k = arrays[HISTORY_SKILLS].shape[2]
        for name in RANK_INPUT_NAMES:
            expected = history if name.startswith("history") else candidates
            expected = (*expected, k) if name in SKILL_INPUTS else expected
            if arrays[name].shape != expected or expected[0] != history[0] or k < 1:
                return None, f"input '{name}' has shape {list(arrays[name].shape)}, expected {list(expected)}"
        if self.window is not None and history[1] != self.window - 1:
            return None, f"input '{HISTORY_QUESTIONS}' has length {history[1]}, expected {self.window - 1}"
        if candidates[1] < 1:
            return None, f"input '{CANDIDATE_QUESTIONS}' needs at least one candidate"
        for names, size in (((HISTORY_QUESTIONS, CANDIDATE_QUESTIONS), self.n_questions),
                            ((HISTORY_SKILLS, CANDIDATE_SKILLS), self.n_skills)):
            for name in names:
                a = arrays[name]
                if a.size and (a.min() < 0 or a.max() >= size):
                    return None, f"input '{name}' has ids outside [0, {size})"
        r = arrays[HISTORY_RESPONSES]
        if r.size and (r.min() < -1 or r.max() > 1):
            return None, f"input '{HISTORY_RESPONSES}' must hold only -1, 0 or 1"
        return arrays, None

    def _read_score(self, request):
        """The three int64 [b, L] inputs of one request, or (None, message) when invalid."""
        arrays = {}
        for name in INPUT_NAMES:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                return None, f"missing input '{name}'"
            arrays[name] = tensor.as_numpy()
        shape = arrays[QUESTIONS].shape
        for name in INPUT_NAMES:
            a = arrays[name]
            if a.shape[:2] != shape or a.ndim != (3 if name in SKILL_INPUTS else 2) or 0 in a.shape[2:]:
                return None, (f"input '{name}' has shape {list(a.shape)}; all inputs must share one "
                              f"[batch, window] shape (skills [batch, window, K]), '{QUESTIONS}' has {list(shape)}")
            if a.dtype != np.int64:
                return None, f"input '{name}' must be INT64, got {a.dtype}"
        if self.window is not None and shape[1] != self.window:
            return None, f"input '{QUESTIONS}' has window {shape[1]}, expected {self.window}"
        limits = ((QUESTIONS, self.n_questions), (SKILLS, self.n_skills))
        for name, size in limits:
            a = arrays[name]
            if a.size and (a.min() < 0 or a.max() >= size):
                return None, f"input '{name}' has ids outside [0, {size})"
        r = arrays[RESPONSES]
        if r.size and (r.min() < -1 or r.max() > 1):      # int64: the range check is {-1, 0, 1}
            return None, f"input '{RESPONSES}' must hold only -1, 0 or 1"
        return arrays, None

    def _read_step(self, request, kind):
        """The inputs of one step request (dtypes, axes and fixed dims as the step graph's), or (None, message)."""
        session = self.steps[kind]
        held, keys = {}, {}
        for name in (STATE_REF, KEEP_AS):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                keys[name] = tensor.as_numpy().reshape(-1)
                if self.held is None:
                    return None, f"input '{name}': this model keeps no states (config {PARAM_HELD_STATE_BYTES})"
                if keys[name].dtype != np.int64:
                    return None, f"input '{name}' must be INT64 [batch]"
        if STATE_REF in keys:                      # a held call: the state is the one kept under state_ref
            length = pb_utils.get_input_tensor_by_name(request, STATE_LENGTH)
            if length is None:
                return None, f"missing input '{STATE_LENGTH}' of the {kind} graph"
            held = self.held.gather(keys[STATE_REF], length.as_numpy().reshape(-1))
            if held is None:
                return None, f"{STATE_NOT_HELD}: a state_ref is not kept here (evicted, or a new model instance)"
        arrays = {}
        for spec in session.get_inputs():
            tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
            if tensor is None and spec.name not in held:
                return None, f"missing input '{spec.name}' of the {kind} graph"
            a = arrays[spec.name] = tensor.as_numpy() if tensor is not None else held[spec.name]
            dims = [d if isinstance(d, int) else -1 for d in spec.shape]
            if a.dtype != ORT_DTYPES.get(spec.type) or a.ndim != len(dims) or any(
                    d >= 0 and n != d for d, n in zip(dims[1:], a.shape[1:])) or 0 in a.shape[1:]:
                return None, (f"input '{spec.name}' must be {spec.type} of shape {['batch'] + dims[1:]}, "
                              f"got {a.dtype} {list(a.shape)}")
        sizes = {}                                 # each named axis (batch, history, candidates, skills): one size
        for spec in session.get_inputs():
            for axis, n in zip(spec.shape, arrays[spec.name].shape):
                if not isinstance(axis, int) and sizes.setdefault(axis, n) != n:
                    return None, f"the inputs of the {kind} graph disagree on their '{axis}' axis"
        for name, a in arrays.items():
            limit = {"questions": self.n_questions, "skills": self.n_skills}.get(ID_LIMITS.get(name))
            if limit is not None and a.size and (a.min() < 0 or a.max() >= limit):
                return None, f"input '{name}' has ids outside [0, {limit})"
            if name in RESPONSE_INPUTS and a.size and (a.min() < -1 or a.max() > 1):
                return None, f"input '{name}' must hold only -1, 0 or 1"
        length = arrays.get(STATE_LENGTH)
        if length is not None and length.size and length.min() < 0:
            return None, f"input '{STATE_LENGTH}' must be >= 0"
        if length is not None and self.window is not None and not self.band and length.size and (
                length.max() > self.window - 1):
            return None, f"input '{STATE_LENGTH}' must be in [0, {self.window - 1}]"
        rows = arrays[session.get_inputs()[0].name].shape[0]
        if any(k.shape[0] != rows for k in keys.values()):
            return None, f"the inputs of the {kind} graph disagree on their 'batch' axis"
        return {**arrays, **keys}, None

    def finalize(self):
        self.session = None
        self.explain_session = None
        self.steps = {}
        self.held = None
        self.held_gauges = []
        self.exec_seconds = None
        self.exec_family = None


def _wants_explain(request):
    """True when the request asks for an explain output (Triton's requested_output_names)."""
    requested = getattr(request, "requested_output_names", None)
    return bool(requested is not None and {EXPLAIN_ATTENTION, EXPLAIN_HEAD_WEIGHTS} & set(requested()))


def _error(message, code):
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
