"""`model_info.json`: what one exported model version is, written by export and read by serving.

    {"format": "routerkt-model-info/2", "name": "routerkt-akt", "window": 100,
     "n_questions": 1234, "n_skills": 56, "preset": "routerkt-akt", "backbone": "akt",
     "attention": "standard", "heads": "router", "routing_scope": "prefix",
     "backend": "python", "quantization": "none", "padding": "left",
     "graphs": {"score": {...}, "rank": {...}}, "served_graph": "rank",
     "parity_max_abs_diff": 3.6e-07, "rank_parity_max_abs_diff": 2.4e-07,
     "provenance": {"run_id": ..., "git_sha": ..., ...}}

This dataclass owns the schema: `to_json` writes it, `from_json` checks it and raises
ModelInfoError naming the file and the field. Format 1 (before the contract existed) had flat
"inputs"/"outputs" lists for the one graph; it is still read. A version exported with its step graphs
(the default) also has "step_graphs" (the step graphs' names -> inputs/outputs,
routerkt/contract/step_signature.py) and "step_parity_max_abs_diff"; both keys are absent otherwise (and
in older files). "context" is "window" (absent in older files) or "band" (training/config.py Context).
"held_states" (with step graphs; absent in older files: false): the version's model.py can keep learner states
(the held graphs of routerkt/contract/step_signature.py), which serving uses only where config.pbtxt declares them.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from routerkt.contract.json_file import read_json
from routerkt.contract.signature import GRAPHS, SCORE
from routerkt.contract.step_signature import state_kind_of
from routerkt.errors import UserError

FORMAT = "routerkt-model-info/2"
FORMAT_1 = "routerkt-model-info/1"


class ModelInfoError(UserError):
    """A model_info.json is missing or malformed; str(error) is `<where>: <problem>`."""


def _graph_names() -> dict[str, dict[str, list[str]]]:
    return {g.name: {"inputs": list(g.input_names), "outputs": list(g.output_names)} for g in GRAPHS.values()}


CONTEXTS = ("window", "band")     # training/config.py Context


@dataclass(frozen=True)
class ModelInfo:
    """One model version, as export describes it to serving."""

    name: str
    window: int                     # sequence length of the exported graphs (Triton dims [window])
    n_questions: int = 0            # embedding rows (vocabulary + padding + unknown)
    n_skills: int = 0
    preset: str = ""
    backbone: str = ""
    attention: str = ""
    heads: str = ""
    routing_scope: str = ""
    backend: str = "python"         # Triton backend of the version: python | onnxruntime | tensorrt
    quantization: str = "none"
    padding: str = "left"
    graphs: dict[str, dict[str, list[str]]] = field(default_factory=_graph_names)
    served_graph: str = "score"     # the graph Triton serves for this version (config.pbtxt inputs)
    parity_max_abs_diff: float = math.nan
    rank_parity_max_abs_diff: float = math.nan
    explain_parity_max_abs_diff: float = math.nan   # nan: no explain graph (explain.onnx) in the version
    provenance: dict[str, str] = field(default_factory=dict)
    step_graphs: dict[str, dict[str, list[str]]] = field(default_factory=dict)   # empty: no step graphs
    step_parity_max_abs_diff: float = math.nan
    context: str = "window"         # window: the last window - 1 interactions; band: the whole history (step graphs)
    held_states: bool = False       # its model.py runs the held graphs (step_signature.py): written with step graphs

    @property
    def band(self) -> bool:
        """A band model: its prediction reads the whole history through its step state (no window edge)."""
        return self.context == "band"

    @property
    def step_state(self) -> str | None:
        """The state kind of the version's step graphs (attention | recurrent), None without them."""
        return state_kind_of(self.step_graphs) if self.step_graphs else None

    def to_json(self) -> dict[str, Any]:
        d = {"format": FORMAT, **asdict(self)}
        if not self.step_graphs:                  # a version without step graphs: the file as before them
            del d["step_graphs"], d["step_parity_max_abs_diff"], d["held_states"]
        return d

    def save_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, d: Any, where: str = "model_info") -> ModelInfo:
        if not isinstance(d, dict):
            raise ModelInfoError(f"{where}: must hold a JSON object")
        fmt = d.get("format")
        if fmt not in (FORMAT, FORMAT_1):
            raise ModelInfoError(f"{where}: format is {fmt!r}, expected {FORMAT!r}")
        window = d.get("window")
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise ModelInfoError(f"{where}: 'window' must be an integer >= 2, got {window!r}")
        name = d.get("name", "")
        if not isinstance(name, str):
            raise ModelInfoError(f"{where}: 'name' must be a string")
        graphs = d.get("graphs")
        if fmt == FORMAT_1:
            graphs = {SCORE.name: {"inputs": list(d.get("inputs", SCORE.input_names)),
                                   "outputs": list(d.get("outputs", SCORE.output_names))}}
        if not isinstance(graphs, dict) or SCORE.name not in graphs:
            raise ModelInfoError(f"{where}: 'graphs' must name at least the {SCORE.name!r} graph")
        kwargs: dict[str, Any] = {"name": name, "window": window, "graphs": graphs}
        for key in ("n_questions", "n_skills"):
            value = d.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ModelInfoError(f"{where}: '{key}' must be an integer >= 0, got {value!r}")
            kwargs[key] = value
        for key in ("preset", "backbone", "attention", "heads", "routing_scope", "backend", "quantization",
                    "padding", "served_graph", "context"):
            if key in d:
                if not isinstance(d[key], str):
                    raise ModelInfoError(f"{where}: '{key}' must be a string, got {d[key]!r}")
                kwargs[key] = d[key]
        if kwargs.get("served_graph", "score") not in GRAPHS:
            raise ModelInfoError(f"{where}: served_graph must be one of {sorted(GRAPHS)}")
        if kwargs.get("context", "window") not in CONTEXTS:
            raise ModelInfoError(f"{where}: context must be one of {', '.join(CONTEXTS)}")
        if kwargs.get("padding", "left") != "left":
            raise ModelInfoError(f"{where}: padding is {kwargs['padding']!r}; this code serves left padding only")
        for key in ("parity_max_abs_diff", "rank_parity_max_abs_diff", "explain_parity_max_abs_diff",
                    "step_parity_max_abs_diff"):
            value = d.get(key, math.nan)
            kwargs[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        provenance = d.get("provenance", {})
        if not isinstance(provenance, dict):
            raise ModelInfoError(f"{where}: 'provenance' must be an object")
        kwargs["provenance"] = {str(k): str(v) for k, v in provenance.items()}
        kwargs.update(_step_fields(d, where))
        return cls(**kwargs)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ModelInfo:
        d = read_json(path, ModelInfoError)
        return cls.from_json(d, str(path))


def _step_fields(d: dict, where: str) -> dict[str, Any]:
    """`step_graphs` checked: absent or empty, or exactly one state kind's step graphs."""
    step_graphs = d.get("step_graphs", {})
    if not isinstance(step_graphs, dict) or (step_graphs and state_kind_of(step_graphs) is None):
        raise ModelInfoError(f"{where}: 'step_graphs' must name the step graphs of one state kind "
                             "(routerkt/contract/step_signature.py)")
    held = d.get("held_states", False)
    if not isinstance(held, bool):
        raise ModelInfoError(f"{where}: 'held_states' must be true or false, got {held!r}")
    return {"step_graphs": step_graphs, "held_states": held and bool(step_graphs)}
