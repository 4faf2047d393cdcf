"""`retrain`, the stages of `routerkt retrain`: export, split, score, train, gate, publish, canary.

The store is exported and split forward in time; the versions in force are scored on the held-out events,
the better one is the base (loop/retrain/base_version.py: the new model trains from it and must beat it), the new
model is trained and scored, and published only past the offline gate, then canaried over the base.

A canary still undecided when the retrain starts (docs/learning-loop.md, "An undecided canary"): until its
candidate has `canary_patience` outcomes the retrain leaves it running and publishes nothing (exit 3); after
that, its test is taken as "no difference it can detect", both of its versions are scored offline, and the
new model is trained from the better of the two and must beat it; it becomes the new canary's baseline."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from loop.retrain import serving_calls
from loop.retrain.base_version import Base, choose_base
from loop.retrain.lock import retrain_lock
from loop.retrain.private import private_data, sweep
from routerkt.atomic import atomic_write_bytes
from routerkt.contract.repository_reader import latest_version, list_versions, read_model_info, read_vocab, version_dir
from routerkt.contract.signature import CONFIG_FILE
from routerkt.errors import UserError

if TYPE_CHECKING:
    from loop.retrain.train import Trained
    from serving.rollout.policy_source import PolicySource

PUBLISHED, NOT_PUBLISHED = 0, 3
MARGIN = 0.002             # the new version's held-out log loss must be below the base version's minus this
WEIGHT = 0.1               # the canary's share of learners
CANARY_PATIENCE = 3000     # candidate outcomes an undecided canary gets before a retrain may replace it
DEFAULT_POLICY_FILE = Path(".routerkt") / "rollout.json"


@dataclass
class RetrainOptions:
    store: str
    repository: Path
    model: str
    out: Path
    runs: Path = Path("runs")
    policy_file: Path | None = None      # None: the default file, unless --gateway (then its API)
    preset: str | None = None
    cutoff_ms: int | None = None
    warm_start: bool = True
    margin: float = MARGIN
    weight: float = WEIGHT
    epochs: int = 20
    overrides: list[str] = field(default_factory=list)
    gateway: str | None = None
    gateway_ca_file: Path | None = None
    api_key_file: Path | None = None
    load_timeout_s: float = 300.0
    store_password_file: Path | None = None
    store_ca_file: Path | None = None
    keep_data: bool = False
    canary_patience: int = CANARY_PATIENCE

    def rollout(self) -> PolicySource:
        """Where the policy is read and changed: the gateway's API with --gateway, else the file."""
        return serving_calls.policy_source(self.gateway, self.gateway_ca_file, self.api_key_file,
                                           self.policy_file or DEFAULT_POLICY_FILE)


@dataclass
class Report:
    model: str
    store: str = ""
    served_version: int | None = None
    base_version: int | None = None   # the version the new model must beat, trained from (loop/retrain/base_version.py)
    new_version: int | None = None
    outcome: str = ""              # published | not_better | canary_undecided
    decision: str = ""
    sizes: dict = field(default_factory=dict)
    vocab: dict = field(default_factory=dict)
    warm_start: dict | None = None
    served: dict = field(default_factory=dict)
    candidate: dict = field(default_factory=dict)
    canary: dict | None = None     # the canary met at the start: versions, outcomes, interval, rule applied
    compared: dict = field(default_factory=dict)   # version -> held-out metrics of each version compared
    margin: float = MARGIN
    cutoff_ms: int | None = None
    cutoff: str = ""
    seconds: dict = field(default_factory=dict)
    policy: str = ""
    config: str = ""
    training: dict = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str, log=None) -> Iterator[None]:
        started = time.perf_counter()
        if log is not None:
            log(f"{name}...")
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 2)


def check_options(opts: RetrainOptions) -> None:
    if not (math.isfinite(opts.margin) and opts.margin >= 0):
        raise UserError(f"--margin must be >= 0, got {opts.margin}")
    if not 0 < opts.weight <= 1:
        raise UserError(f"--weight must be in (0, 1], got {opts.weight}")
    if opts.epochs < 1:
        raise UserError(f"--epochs must be >= 1, got {opts.epochs}")
    if opts.canary_patience < 0:
        raise UserError(f"--canary-patience must be >= 0, got {opts.canary_patience}")
    if opts.gateway and opts.policy_file is not None:
        raise UserError("--gateway and --policy-file: with --gateway the policy changes through the gateway's API "
                        "(it writes the file it watches); give one of them")
    if not Path(opts.repository).is_dir():
        raise UserError(f"--repository {opts.repository}: no such model repository")
    writable = os.access(opts.repository, os.W_OK | os.X_OK)
    if not writable or not os.access(Path(opts.repository).resolve().parent, os.W_OK):
        raise UserError(f"the repository {opts.repository} is not writable (nor staging beside it)")
    if Path(opts.out).exists() and any(Path(opts.out).iterdir()):
        raise UserError(f"--out {opts.out} already holds files; choose a new folder")


def retrain(opts: RetrainOptions, log=print) -> tuple[int, Report]:
    """(exit code, report): 0 published and in canary, 3 nothing published (not better, or a canary undecided);
    UserError: exit 2."""
    check_options(opts)
    report = Report(model=opts.model, margin=opts.margin)
    with retrain_lock(opts.repository):
        for stale in sweep(opts.runs):
            log(f"removed {stale}: learner data a killed retrain left")
        code = _run(opts, report, log)
    return code, report


def _run(opts: RetrainOptions, report: Report, log) -> int:
    started = time.perf_counter()
    state, served = _served_state(opts, report, log)
    if report.canary is not None and not report.canary["replace"]:
        return _finish(report, "canary_undecided", report.canary["text"] + "; nothing published", started, log)
    compare = [served] + ([report.canary["candidate"]] if report.canary is not None else [])
    trained, base = _train_and_score(opts, report, compare, log)
    reference = base.version
    report.served = report.compared[str(reference)]
    better = report.candidate["log_loss"] < report.served["log_loss"] - opts.margin
    if not better:
        decision = (f"not better: held-out log loss {report.candidate['log_loss']:.4f} is not below version "
                    f"{reference}'s {report.served['log_loss']:.4f} - margin {opts.margin:g}; nothing published"
                    + ("; the canary keeps running" if report.canary is not None else ""))
        return _finish(report, "not_better", decision, started, log)
    with report.stage("export_candidate", log):
        from export.exporter import export_run
        candidate_repo = Path(opts.out) / "candidate"
        # the base version's step graphs carry over: the model keeps one config.pbtxt (a candidate without
        # them would change it, and Triton would reload every version, the canary's baseline included)
        result = export_run(trained.run, candidate_repo, name=opts.model, backend=base.info.backend or "python",
                            log=lambda *_: None, step_graphs=base.info.step_state is not None)
        candidate_dir = version_dir(candidate_repo, opts.model, result.version)
    with report.stage("publish", log):
        report.new_version = _publish_and_canary(opts, state, reference, candidate_repo, candidate_dir, report, log)
    shutil.rmtree(candidate_repo, ignore_errors=True)
    decision = f"published version {report.new_version} as a canary at weight {opts.weight:g} over version {reference}"
    return _finish(report, "published", decision, started, log)


def _finish(report: Report, outcome: str, decision: str, started: float, log) -> int:
    """Record the outcome, its decision and the total time; the exit code (published or not)."""
    report.outcome, report.decision = outcome, decision
    report.seconds["total"] = round(time.perf_counter() - started, 2)
    log(report.decision)
    return PUBLISHED if outcome == "published" else NOT_PUBLISHED


def _served_state(opts: RetrainOptions, report: Report, log) -> tuple[dict, int]:
    """The model's rollout state (its policy entry, versions, split) and the version it serves; the canary
    met, if any, into `report`. UserError when the repository holds no served version."""
    repo = Path(opts.repository)
    status = opts.rollout().status()
    state = status.get("models", {}).get(opts.model) or {"entry": {"policy": "latest"}, "versions": [],
                                                           "served": None, "split": None}
    served = state["served"] if state["served"] is not None else latest_version(repo, opts.model)
    if served is None or served not in list_versions(repo, opts.model):
        raise UserError(f"model {opts.model} has no served version in {repo} (policy {state['entry'].get('policy')}, "
                        f"version {served}); export one first")
    report.served_version = served
    log(f"retrain of {opts.model}: served version {served} ({status.get('source')}: {state['entry'].get('policy')})")
    report.canary = _canary(state, status, opts)
    return state, served


def _train_and_score(opts: RetrainOptions, report: Report, compare: list[int], log) -> tuple[Trained, Base]:
    """The stages on the learners' data (a private folder, removed after): export the store, split it forward
    in time, score each version of `compare` on the held-out events, which chooses the base (the version the
    new model must beat, loop/retrain/base_version.py), train from that base, then score the new model.
    Returns (the trained model, the base)."""
    from loop.retrain.data import split_events
    from loop.retrain.score import score_model, score_version
    repo, out = Path(opts.repository), Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    with private_data(out, opts.keep_data) as data:
        events_csv, train_csv = data / "events.csv", data / "train.csv"
        with report.stage("export", log):
            exported = serving_calls.export_store(opts.store, events_csv, opts.store_password_file, opts.store_ca_file)
            report.store = exported.get("store", "")
            log(f"export: {exported.get('events', 0):,} events of {exported.get('learners', 0):,} learners")
        with report.stage("split", log):
            split = split_events(events_csv, train_csv, opts.cutoff_ms)
            report.sizes, report.cutoff_ms, report.cutoff = split.sizes, split.cutoff_ms, split.cutoff_text
            log(f"split at {split.cutoff_text}: {split.sizes['train_events']:,} events train, "
                f"{split.sizes['heldout_events']:,} held out")
        with report.stage("evaluate", log):
            for version in compare:
                report.compared[str(version)] = score_version(
                    version_dir(repo, opts.model, version), read_vocab(repo, opts.model, version),
                    read_model_info(repo, opts.model, version).window, split)
        base = choose_base(repo, opts.model, report.compared)
        report.base_version = base.version
        with report.stage("train", log):
            trained = _train(opts, base, train_csv, out, report, log)
        with report.stage("evaluate_new", log):
            from training.checkpoint import load_checkpoint
            report.candidate = score_model(load_checkpoint(trained.run / "fold-0").model, trained.vocab,
                                           trained.window, split)
    return trained, base


def _canary(state: dict, status: dict, opts: RetrainOptions) -> dict | None:
    """The split (canary or shadow) in force, its outcomes and test, and whether this retrain may replace it
    (None: no split). Without a gateway its outcomes cannot be read, so it is left running."""
    split = state.get("split")
    if not split:
        return None
    baseline, candidate = split["baseline"], split["candidate"]
    since = state.get("since_canary_began") or {}
    counts = {v: since.get(str(v), {}).get("outcomes") for v in (baseline, candidate)}
    test = (status.get("sequential_tests") or {}).get(opts.model)
    out = {"baseline": baseline, "candidate": candidate, "policy": state["entry"].get("policy"),
           "outcomes": {"baseline": counts[baseline], "candidate": counts[candidate]}, "patience": opts.canary_patience,
           "interval": None if not test else [test["difference"]["lower"], test["difference"]["upper"]]}
    name = f"{out['policy']} {baseline}->{candidate}"
    if counts[candidate] is None:
        out["replace"] = False
        out["text"] = (f"{name} is in force and its outcomes are unknown here (give --gateway to read them); "
                       "it keeps running")
        return out
    interval = "" if not out["interval"] else \
        f", interval [{out['interval'][0]:+.4f}, {out['interval'][1]:+.4f}] nats"
    seen = f"after {counts[candidate]:,} candidate / {counts[baseline] or 0:,} baseline outcomes{interval}"
    out["replace"] = counts[candidate] >= opts.canary_patience
    out["text"] = (f"{name} undecided {seen}: " + (
        f"past the patience of {opts.canary_patience:,} candidate outcomes, so both are scored and the new model is "
        "trained from the better one, must beat it and is canaried over it" if out["replace"] else
        f"it keeps running until its candidate has {opts.canary_patience:,} outcomes or its test decides"))
    return out


def _train(opts: RetrainOptions, base: Base, train_csv: Path, out: Path, report: Report, log) -> Trained:
    """Train from the base (loop/retrain/base_version.py): its run's configuration, warm from its checkpoint, its
    vocabulary grown by the ids the platform added since."""
    from loop.retrain.train import build_config, train
    from loop.retrain.warm import find_run
    base_fold = find_run(opts.runs, base.info)
    cfg = build_config(base.info, base_fold, opts.preset, train_csv, opts.epochs, opts.overrides)
    warm_fold = None
    if opts.warm_start:
        run_id = base.info.provenance.get("run_id", "?")
        if base_fold is None:
            report.warm_start = {"version": base.version, "note": f"version {base.version}'s run ({run_id}) is "
                                                                  f"not under {opts.runs}: trained from scratch"}
        elif cfg.preset != base.info.preset or cfg.data.window != base.info.window:
            report.warm_start = {"version": base.version, "note": f"another preset or window than version "
                                                                  f"{base.version}'s: trained from scratch"}
        else:
            warm_fold = base_fold
    trained = train(cfg, base.vocab, out, warm_fold, log)
    report.vocab = {"against_version": base.version, **trained.vocab_growth}
    if trained.warm:
        report.warm_start = {"version": base.version, **trained.warm}
    report.training = {"preset": cfg.preset, "epochs_run": trained.result.get("epochs_run"),
                       "best_epoch": trained.result.get("best_epoch"), "valid_auc": trained.result.get("valid_auc"),
                       "device": cfg.train.device.value}
    return trained


def _publish_and_canary(opts: RetrainOptions, state: dict, reference: int, candidate_repo: Path,
                        candidate_dir: Path, report: Report, log) -> int:
    """Pin the served version when the policy names none (so the new version takes no traffic on appearing),
    publish atomically (never pruning a version the policy names), wait for the gateway to load it
    (--gateway), then the canary over `reference`. Any failure removes the published version and restores
    the model's previous policy entry."""
    from export.repository import publish_version
    repo, where = Path(opts.repository), opts.rollout()
    entry_before = state["entry"]
    file_before = None if opts.gateway else _read_or_none(opts.policy_file or DEFAULT_POLICY_FILE)
    new_version = None
    try:
        if state["served"] is None:
            serving_calls.pin(where, opts.model, report.served_version)
        files = {p.name: p for p in candidate_dir.iterdir() if p.is_file()}
        keep = max(3, len([v for v in list_versions(repo, opts.model) if v >= reference]) + 1)
        protected = set(state.get("versions") or []) | {reference, report.served_version}
        config_text, report.config = _config(repo / opts.model / CONFIG_FILE, candidate_repo / opts.model / CONFIG_FILE)
        new_version = publish_version(repo, opts.model, files, config_text, keep_versions=keep, protected=protected)
        log(f"published version {new_version} ({report.config.split(' ')[0]} config.pbtxt)")
        if opts.gateway:
            waited = serving_calls.wait_loaded(opts.gateway, opts.model, new_version, opts.load_timeout_s,
                                          opts.gateway_ca_file)
            report.seconds["load"] = round(waited, 2)
            log(f"the gateway serves version {new_version} after {waited:.1f}s")
        note = None if report.canary is None else f"replaces {report.canary['text'].split(':')[0]}"
        set_to = serving_calls.start_canary(where, opts.model, reference, new_version, opts.weight, note)
        report.policy = f"{set_to.get('source')}: {set_to.get('entry')}"
        return new_version
    except BaseException:
        if new_version is not None:
            _unpublish(repo, opts.model, new_version)
        _restore(opts, where, entry_before, file_before)
        raise


def _config(served: Path, candidate: Path) -> tuple[str, str]:
    """The config.pbtxt to publish with (export/triton_config.py publish_config): the served one whenever only
    the vocabulary changed (the id bounds live in each version's model_info.json), so Triton loads only the
    new version; another config (other inputs or outputs, backend) makes Triton reload every version, while
    the gateway holds the model's calls (docs/learning-loop.md, "Publishing")."""
    from export.triton_config import publish_config
    served_text = served.read_text() if served.is_file() else None
    text = publish_config(served_text, candidate.read_text())
    if text == served_text:
        return text, "kept (the served config; Triton loads only the new version)"
    return text, "replaced (inputs, outputs or backend differ: Triton reloads every version of the model)"


def _unpublish(repository: Path, model: str, version: int) -> None:
    """Take a version back out of the repository in one rename (Triton sees it whole or not at all)."""
    trash = Path(tempfile.mkdtemp(prefix=f".{repository.resolve().name}.unpublish-", dir=repository.resolve().parent))
    try:
        os.rename(repository / model / str(version), trash / str(version))
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def _read_or_none(path: Path) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None


def _restore(opts: RetrainOptions, where: PolicySource, entry: dict, file_before: bytes | None) -> None:
    """The model's previous policy: the file's previous bytes, or through the gateway its previous entry."""
    if not opts.gateway:
        path = opts.policy_file or DEFAULT_POLICY_FILE
        if file_before is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_bytes(path, file_before)
        return
    try:
        serving_calls.put_entry(where, opts.model, entry)
    except UserError as exc:
        raise UserError(f"retrain failed and could not restore the policy of {opts.model} ({entry}): {exc}") from None
