"""The one registry: backbone enum -> model class (filled by @register in each backbone module), and
presets with the papers' names -> ModelConfig field values. `run_config` turns a preset and config
overrides into a run's RunConfig (a band model, model.context=band, trains on whole histories:
data.protocol=whole unless the overrides set one). Trainer, exporter and evaluator call `build_model(config)` and
never branch on a model name.

Every attention preset uses the same width and depth (d_model 64, 2 blocks, 8 heads, d_ff 256), so
the variants differ only in their attention bias or routing.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Any

from routerkt.errors import UserError
from training.config import Backbone, Context, ModelConfig, Protocol, RunConfig, apply_overrides, from_dict, to_dict
from training.models import akt, cl4kt, dkt, simplekt  # noqa: F401  (registration side effect)
from training.models.kt_model import MODELS, KTModel

_ROUTER = {"heads": "router", "attention": "standard"}
_CL4KT = {"backbone": "cl4kt", "contrastive": True, "dropout": 0.2}
_SIMPLEKT = {"backbone": "simplekt", "dropout": 0.1}

PRESETS: dict[str, dict[str, Any]] = {
    # AKT backbone: the attention-bias comparison of the RouterKT paper
    "akt": {"backbone": "akt", "attention": "monotonic"},
    # a band model by default (as routerkt-akt): its served AUC beat the window model's on assist2009 and
    # statics2011, every fold (results/served/PROTOCOLS.md); the paper grid pins model.context=window
    # (training/paper/reproduce.py)
    "akt-standard": {"backbone": "akt", "attention": "standard", "context": "band"},
    "alibi-akt": {"backbone": "akt", "attention": "alibi"},              # ALiBi on all six layers
    # FoLiBi as its paper: ALiBi in the knowledge retriever, monotonic (AKT) encoders with gradient
    "folibi-akt": {"backbone": "akt", "attention": "alibi", "encoder_attention": "monotonic"},
    # RKT-style recency mixture (learned per-head lambda and tau); NO question-relation matrix, so
    # it is not RKT itself (docs/training.md, "Presets")
    "relative-akt": {"backbone": "akt", "attention": "relative"},
    "routerkt-akt": {"backbone": "akt", **_ROUTER, "context": "band"},        # a band model by default (above)
    # CL4KT backbone (contrastive loss on, as in CL4KT and RouterCL4KT)
    "cl4kt": {**_CL4KT, "attention": "monotonic"},
    "cl4kt-standard": {**_CL4KT, "attention": "standard"},      # dense standard attention: the control
    "alibi-cl4kt": {**_CL4KT, "attention": "alibi"},                       # ALiBi in every stack
    "folibi-cl4kt": {**_CL4KT, "attention": "alibi", "encoder_attention": "monotonic"},   # FoLiBi's placement
    "routerkt-cl4kt": {**_CL4KT, **_ROUTER},                     # learned gate (what results/ was trained with)
    # RouterCL4KT's own scoring (opt.yaml / CLI default routing_mode=query_norm): head query norms, no gate
    "routerkt-cl4kt-qn": {**_CL4KT, **_ROUTER, "router_scoring": "query_norm"},
    # SimpleKT backbone
    "simplekt": {**_SIMPLEKT, "attention": "standard"},
    "alibi-simplekt": {**_SIMPLEKT, "attention": "alibi"},                 # its one stack is the retriever
    "routerkt-simplekt": {**_SIMPLEKT, **_ROUTER},
    # the classic reference point
    "dkt": {"backbone": "dkt", "dropout": 0.2},
}

# Each attention backbone's dense standard-attention control: what a variant is compared with
# fold by fold (training/paper/results_report.py). DKT has none.
DENSE_CONTROLS: dict[Backbone, str] = {Backbone.AKT: "akt-standard", Backbone.CL4KT: "cl4kt-standard",
                                       Backbone.SIMPLEKT: "simplekt"}


def dense_control(preset: str) -> str | None:
    """The preset a variant of `preset` is compared with (None: no control, or it is the control)."""
    if preset not in PRESETS:
        return None
    control = DENSE_CONTROLS.get(preset_config(preset).backbone)
    return None if control == preset else control


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return from_dict(ModelConfig, {**to_dict(ModelConfig()), **PRESETS[name]})


def run_config(preset: str, data_path: str | os.PathLike = "", overrides: Iterable[str] = ()) -> RunConfig:
    """The RunConfig of a preset on a data file, then `section.key=value` overrides in order (what
    `train`, `reproduce` and `bench train` run); a bad override raises UserError."""
    cfg = RunConfig(preset=preset, model=preset_config(preset))
    cfg.data.path = str(data_path)
    overrides = list(overrides)
    try:
        cfg = apply_overrides(cfg, overrides)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return trained_as_served(cfg, overrides)


def trained_as_served(cfg: RunConfig, overrides: Iterable[str], window: Protocol | None = None) -> RunConfig:
    """A band model trains on what it serves, whole histories; a window model on `window` (None: as configured);
    an override naming data.protocol wins over both."""
    if not any(o.strip().startswith("data.protocol=") for o in overrides):
        protocol = Protocol.WHOLE if cfg.model.context is Context.BAND else window
        if protocol is not None:
            cfg.data.protocol = protocol
    return cfg


def build_model(cfg: ModelConfig) -> KTModel:
    return MODELS[cfg.backbone](cfg)


def with_vocab(cfg: ModelConfig, n_questions: int, n_skills: int) -> ModelConfig:
    return dataclasses.replace(cfg, n_questions=n_questions, n_skills=n_skills)
