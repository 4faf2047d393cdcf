"""Configuration dataclasses for data, model and training, their enums, and JSON (de)serialisation.

A run is fully described by `RunConfig` (data + model + train). It is saved as JSON next to the
weights (meta.json) so that evaluation and export can rebuild the model from that file alone.
`apply_overrides` implements the CLI's `--set section.key=value`.
"""
from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass, field
from typing import Any


class Backbone(str, enum.Enum):
    AKT = "akt"            # question encoder + knowledge encoder + retriever, Rasch difficulty (Ghosh et al.)
    CL4KT = "cl4kt"        # question encoder -> interaction encoder -> retriever, optional contrastive loss
    SIMPLEKT = "simplekt"  # one retriever stack over difficulty-aware embeddings (pyKT simpleKT)
    DKT = "dkt"            # LSTM baseline (Piech et al.); ignores every attention field


class AttentionKind(str, enum.Enum):
    STANDARD = "standard"    # softmax(QK^T/sqrt(d) + M)
    MONOTONIC = "monotonic"  # AKT context-aware exponential decay, trained with gradient
    RELATIVE = "relative"    # RKT-style: sigmoid(a)*content + (1-sigmoid(a))*recency kernel exp(-|i-j|/tau)
    ALIBI = "alibi"          # FoLiBi/ALiBi: softmax(QK^T/sqrt(d) - m_h*(i-j) + M)


class EncoderAttention(str, enum.Enum):
    """Attention of the encoder stacks (AKT: knowledge and question encoders; CL4KT: question and
    interaction encoders); the retriever always uses `attention`. SimpleKT and DKT have no encoder."""
    SAME = "same"            # every stack uses `attention`
    MONOTONIC = "monotonic"  # FoLiBi's placement: `attention` (ALiBi) in the retriever only, AKT's monotonic
                             # decay (with gradient) in the encoders (FoLiBi's choose_enc="f")


class HeadMode(str, enum.Enum):
    DENSE = "dense"    # every head always on, weight 1
    ROUTER = "router"  # RouterKT: shared heads + top-K routed dynamic heads


class RoutingScope(str, enum.Enum):
    PREFIX = "prefix"      # causal person-wise: mean of token routing weights over valid positions <= t
    SEQUENCE = "sequence"  # the paper's whole-window mean: leaks the future; reproduction only, refused by export
    TOKEN = "token"        # each position uses its own routing weights (ablation)


class RouterScoring(str, enum.Enum):
    """How the router scores the dynamic experts of a token (before top-K and aggregation)."""
    LEARNED = "learned"        # g = softmax(W_g h_t), a learned linear gate (RouterAKT / RouterSimpleKT)
    QUERY_NORM = "query_norm"  # RouterCL4KT's: no router parameter; logit_i = ||q_t of head i||_2 divided by the
                               # unbiased std over the dynamic heads (no centring, no temperature), then softmax;
                               # the std is floored so equal norms give uniform gates (the reference gives NaN).
                               # Attention-head experts only (FFN experts have no per-head query)


class ExpertKind(str, enum.Enum):
    HEADS = "heads"  # attention heads are the experts (RouterKT)
    FFN = "ffn"      # dense attention, the feed-forward block is a mixture of FFN experts (ablation)


class Batching(str, enum.Enum):
    # Measured (issue 15, same seed): routerkt-akt assist2009 test AUC 0.7374 length_bucketed vs
    # 0.7538 random; DKT assist2009 fold 0 0.7413 vs 0.7501. Length-sorted batches make each Adam
    # step see only short or only long histories, and the per-batch mean BCE then weighs a token of
    # a short batch up to ~200x one of a long batch. Bucketing changes results; it is not speed only.
    RANDOM = "random"                    # uniform shuffle of learners into batches (neutral)
    LENGTH_BUCKETED = "length_bucketed"  # groups of 50 batches sorted by length (faster, CHANGES results)


class Device(str, enum.Enum):
    AUTO = "auto"   # CUDA when this torch build sees a GPU (rank r of a data-parallel run: cuda:r), else CPU
    CPU = "cpu"
    CUDA = "cuda"   # an error when no GPU is visible


class SkillRows(str, enum.Enum):
    # Expanded multi-skill files write an interaction tagged with k skills as k consecutive rows of one
    # learner with the same question and answer (assist2009). Reading them as k interactions shows the
    # model the answer it predicts (assist2009 routerkt-akt: +0.0106 test AUC, all of it leak).
    MERGE = "merge"    # one interaction with the rows' skill SET (default; training/data/skill_rows.py)
    FIRST = "first"    # one interaction with the first row's skill (recorded as collapse_repeats=true)
    EXPAND = "expand"  # one interaction per row: LEAKS; reproduces numbers of tools that expand
                       # (collapse_repeats=false)


class Protocol(str, enum.Enum):
    RECENT = "recent"  # the paper's: the most recent `window` interactions per learner
    CHUNKS = "chunks"  # split each history into consecutive `window`-long pieces (uses all data)
    WHOLE = "whole"    # one sequence per learner, its whole history (band models: what the server computes)


class Context(str, enum.Enum):
    """What a prediction reads of a learner's history (docs/training.md, "Window and band models")."""
    WINDOW = "window"  # the last W - 1 interactions (W = max_len; the paper's); past the window the server rebuilds
    BAND = "band"      # the whole history through banded causal attention: every layer's query sees at most the
                       # W - 1 positions before it, so per-position states are final once computed and a rolling
                       # buffer of W - 1 columns per layer is exact at any length (trained on whole histories)


@dataclass
class DataConfig:
    path: str = ""                  # canonical CSV (plain or .gz); recorded portable (training/data/pipeline.py)
    dataset: str = ""               # the dataset's name (its folder under the data root); set from path when empty
    protocol: Protocol = Protocol.RECENT
    window: int = 100               # interactions per sequence (model max length)
    min_interactions: int = 5       # learners (and chunks) shorter than this are dropped
    folds: int = 5                  # K of K-fold cross-validation over learners
    valid_ratio: float = 0.1        # share of each fold's training learners used for early stopping
    seed: int = 12405               # split seed (the reference code's)
    skill_rows: SkillRows = SkillRows.MERGE  # rows of one multi-skill interaction -> one interaction (see SkillRows)
    folds_file: str = ""            # JSON {fold: [learner ids]} giving the test learners of each fold
    run_folds: int = 0              # train only the first N folds (0 = all); lets a long grid run part of K


@dataclass
class ModelConfig:
    backbone: Backbone = Backbone.AKT
    attention: AttentionKind = AttentionKind.STANDARD
    encoder_attention: EncoderAttention = EncoderAttention.SAME
    heads: HeadMode = HeadMode.DENSE
    routing_scope: RoutingScope = RoutingScope.PREFIX
    router_scoring: RouterScoring = RouterScoring.LEARNED
    # prefix scope only. False: top-K per token, then the prefix mean of the selected gates (default).
    # True: the paper's text, top-K per person: at each t, the K dynamic heads with the highest prefix
    # mean (valid positions <= t) of the router gates are selected, weighted by that mean; still causal
    person_topk: bool = False
    experts: ExpertKind = ExpertKind.HEADS
    context: Context = Context.WINDOW   # window: the last W - 1 interactions; band: the whole history (see Context)
    d_model: int = 64               # embedding / hidden width
    n_blocks: int = 2               # AKT: encoder depth (retriever stack has 2x); CL4KT: depth of each stack
    n_heads: int = 8
    d_ff: int = 256                 # feed-forward width, the same for every variant so they compare fairly
    dropout: float = 0.05           # dropout on embeddings' residual paths, FFN and prediction MLP
    attn_dropout: float = 0.0       # dropout on attention probabilities (0 keeps the fused CPU kernel)
    fused_attention: bool = True    # scaled_dot_product_attention where the kind allows it (speed only)
    recompute_attention: bool = True  # monotonic: recompute the decayed probabilities in backward (memory only)
    final_fc: int = 512             # prediction MLP: 2d -> final_fc -> final_fc2 -> 1
    final_fc2: int = 256
    max_len: int = 100              # longest sequence; precomputed biases are built for this length
    n_shared: int = 1               # router: always-on heads
    n_selected: int = 2             # router: dynamic heads picked per token (top-K)
    balance_beta: float = 0.01      # router: weight of the load-balance loss (summed over layers)
    rasch_l2: float = 1e-3          # weight of mean(mu_q^2), the Rasch difficulty regulariser (0 disables)
    contrastive: bool = False       # CL4KT: add the InfoNCE loss over augmented views
    cl_weight: float = 0.1          # CL4KT: weight of the contrastive loss
    cl_temperature: float = 0.05
    cl_mask_prob: float = 0.2       # augmentations: mask / crop / permute / replace probabilities
    cl_crop_prob: float = 0.3
    cl_permute_prob: float = 0.3
    cl_replace_prob: float = 0.3
    lstm_hidden: int = 128          # DKT only
    n_questions: int = 0            # vocabulary sizes (padding and unknown rows included); set from the data
    n_skills: int = 0

    @property
    def encoder_kind(self) -> AttentionKind:
        """The attention kind of the encoder stacks (see EncoderAttention)."""
        if self.encoder_attention is EncoderAttention.SAME:
            return self.attention
        return AttentionKind(self.encoder_attention.value)

    @property
    def band(self) -> int:
        """The attention band (max_len) of a band model, 0 for a window model (no band mask)."""
        return self.max_len if self.context is Context.BAND else 0

    @property
    def table_len(self) -> int:
        """Rows of the learner-independent bias tables: W - 1 cached columns plus up to W new rows (a band
        model's chunk, training/models/band.py; a step graph's appended rows)."""
        return 2 * self.max_len

    @property
    def leaks_future(self) -> bool:
        """Routing averaged over the whole window: each position's routing sees later interactions
        (its own answer included), so the model is not causal; reproduction only, never served."""
        return self.heads is HeadMode.ROUTER and self.routing_scope is RoutingScope.SEQUENCE


@dataclass
class TrainConfig:
    epochs: int = 300
    batch_size: int = 512
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 2.0          # max global grad norm
    patience: int = 10              # stop once this many epochs passed since the best validation AUC
                                    # (strict ">", as the reference)
    min_steps: int = 200            # ... but never before this many optimizer steps (a small dataset at batch
                                    # 512 takes one step per epoch, so patience alone can stop it before it
                                    # learns); capped by `epochs`; 0 = off
    seed: int = 12405
    threads: int = 0                # torch intra-op threads (0 = all cores)
    bf16: bool = True               # bfloat16 autocast for training steps, used only on CPUs with bf16 kernels
                                    # (AVX512-BF16/AMX; loop.bf16_available; never on CUDA); weights, attention
                                    # and evaluation stay float32
    batching: Batching = Batching.RANDOM  # batch composition; length_bucketed is an opt-in that changes
                                          # results (see Batching)
    device: Device = Device.AUTO    # where training runs (training/device.py); float32 on CUDA (bf16 autocast
                                    # is CPU-only)
    trim_padding: bool = True       # drop the columns that are padding in every row of a batch (exact: models
                                    # are invariant to left padding; speed only); false pads every batch to
                                    # the full window (the plain path)


@dataclass
class RunConfig:
    preset: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# ----------------------------------------------------------------------------------------------
# JSON round trip

def to_dict(obj: Any) -> Any:
    """Dataclass -> plain JSON-able dict (enums become their values)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def _coerce(field_type: Any, value: Any, where: str) -> Any:
    if isinstance(field_type, type) and issubclass(field_type, enum.Enum):
        try:
            return field_type(value)
        except ValueError:
            choices = ", ".join(m.value for m in field_type)
            raise ValueError(f"{where}: {value!r} is not one of {choices}") from None
    if isinstance(field_type, type) and dataclasses.is_dataclass(field_type):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        return from_dict(field_type, value, where)
    if field_type is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ValueError(f"{where}: {value!r} is not a boolean")
    if field_type is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{where}: {value!r} is not an integer")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {value!r} is not an integer") from None
    if field_type is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {value!r} is not a number") from None
    if field_type is str:
        return str(value)
    return value


def _upgrade_train(data: dict, where: str) -> dict:
    """TrainConfig as recorded before `batching`/`min_steps`: `length_buckets` true meant length-bucketed
    batches, false meant uniformly shuffled ones (both trimmed), and there was no minimum of steps."""
    if "length_buckets" not in data:
        return data
    data = dict(data)
    old = _coerce(bool, data.pop("length_buckets"), f"{where}length_buckets")
    mapped = Batching.LENGTH_BUCKETED if old else Batching.RANDOM
    if "batching" in data and _coerce(Batching, data["batching"], f"{where}batching") is not mapped:
        raise ValueError(f"{where}length_buckets={old} contradicts batching={data['batching']!r}")
    data["batching"] = mapped.value
    data.setdefault("min_steps", 0)
    return data


def _skill_rows_of(collapse: Any, where: str) -> SkillRows:
    """The former `collapse_repeats` flag as what it did: true kept each multi-skill interaction's first
    row, false (its default) kept every row."""
    return SkillRows.FIRST if _coerce(bool, collapse, f"{where}collapse_repeats") else SkillRows.EXPAND


def _upgrade_data(data: dict, where: str) -> dict:
    """DataConfig as recorded before `skill_rows`: `collapse_repeats` (see `_skill_rows_of`)."""
    if "collapse_repeats" not in data:
        return data
    data = dict(data)
    mapped = _skill_rows_of(data.pop("collapse_repeats"), where)
    if "skill_rows" in data and _coerce(SkillRows, data["skill_rows"], f"{where}skill_rows") is not mapped:
        raise ValueError(f"{where}collapse_repeats contradicts skill_rows={data['skill_rows']!r}")
    data["skill_rows"] = mapped.value
    return data


# recorded configs of older versions -> the current fields (what they trained with)
_UPGRADES: dict[type, typing.Callable[[dict, str], dict]] = {TrainConfig: _upgrade_train, DataConfig: _upgrade_data}


def from_dict(cls: type, data: dict, where: str = "") -> Any:
    """Plain dict -> dataclass, validating types; unknown keys are an error (typos must not pass silently).
    Fields renamed since a record was written are mapped first (`_UPGRADES`)."""
    if cls in _UPGRADES:
        data = _UPGRADES[cls](data, f"{where + '.' if where else ''}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where or cls.__name__}: unknown field(s) {', '.join(unknown)}")
    kwargs = {k: _coerce(hints[k], v, f"{where + '.' if where else ''}{k}") for k, v in data.items()}
    return cls(**kwargs)


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply `section.key=value` strings (sections: data, model, train); returns a new config."""
    out = from_dict(RunConfig, to_dict(cfg))
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected section.key=value")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 2 or parts[0] not in ("data", "model", "train"):
            raise ValueError(f"--set {item!r}: key must be data.<field>, model.<field> or train.<field>")
        section = getattr(out, parts[0])
        hints = typing.get_type_hints(type(section))
        if key.strip() == "train.length_buckets":
            raise ValueError(f"--set {item!r}: renamed; use train.batching=random or train.batching=length_bucketed")
        if key.strip() == "data.collapse_repeats":       # former flag: what it did (_skill_rows_of)
            section.skill_rows = _skill_rows_of(value.strip(), "data.")
            continue
        if parts[1] not in hints:
            raise ValueError(f"--set {item!r}: {parts[0]} has no field {parts[1]!r}")
        setattr(section, parts[1], _coerce(hints[parts[1]], value.strip(), key))
    return out
