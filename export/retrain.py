"""`retrain`: export the store, split forward in time, train, score both versions on the held-out events, publish only past the offline gate, then canary."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from export import retrain_commands as commands
from export.retrain_lock import retrain_lock
from routerkt.atomic import atomic_write_bytes, atomic_write_json
from routerkt.contract.repository import latest_version, list_versions, read_model_info, read_vocab, version_dir
from routerkt.contract.signature import CONFIG_FILE
from routerkt.errors import UserError

PUBLISHED, NOT_BETTER = 0, 3
MARGIN = 0.002             # the new version's held-out log loss must be below the served one's minus this
WEIGHT = 0.1               # the canary's share of learners


@dataclass
class RetrainOptions:
    store: str
    repository: Path
    model: str
    out: Path
    runs: Path = Path("runs")
    policy_file: Path = Path(".routerkt") / "rollout.json"
    preset: str | None = None
    cutoff_ms: int | None = None
    warm_start: bool = True
    margin: float = MARGIN
    weight: float = WEIGHT
    epochs: int = 20
    overrides: list[str] = field(default_factory=list)
    gateway: str | None = None
    gateway_ca_file: Path | None = None
    load_timeout_s: float = 300.0
    store_password_file: Path | None = None
    store_ca_file: Path | None = None
    keep_data: bool = False


@dataclass
class Report:
    model: str
    store: str = ""
    served_version: int | None = None
    new_version: int | None = None
    decision: str = ""
    sizes: dict = field(default_factory=dict)
    vocab: dict = field(default_factory=dict)
    warm_start: dict | None = None
    served: dict = field(default_factory=dict)
    candidate: dict = field(default_factory=dict)
    margin: float = MARGIN
    cutoff_ms: int | None = None
    seconds: dict = field(default_factory=dict)
    policy: str = ""
    config: str = ""
    training: dict = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
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
    if not Path(opts.repository).is_dir():
        raise UserError(f"--repository {opts.repository}: no such model repository")
    if not os.access(opts.repository, os.W_OK | os.X_OK) or not os.access(Path(opts.repository).resolve().parent, os.W_OK):
        raise UserError(f"the repository {opts.repository} is not writable (nor staging beside it)")
    if Path(opts.out).exists() and any(Path(opts.out).iterdir()):
        raise UserError(f"--out {opts.out} already holds files; choose a new folder")


def retrain(opts: RetrainOptions, log=print) -> tuple[int, Report]:
    """(exit code, report): 0 published and in canary, 3 not better (nothing published); UserError: exit 2."""
    check_options(opts)
    report = Report(model=opts.model, margin=opts.margin)
    with retrain_lock(opts.repository):
        code = _run(opts, report, log)
    return code, report


def _run(opts: RetrainOptions, report: Report, log) -> int:
    from export.retrain_data import split_events
    from export.retrain_score import score_model, score_version
    started = time.perf_counter()
    repo, out = Path(opts.repository), Path(opts.out)
    entry = commands.current_policy(opts.model, opts.policy_file)
    served = commands.served_version(entry, latest_version(repo, opts.model))
    if served is None or served not in list_versions(repo, opts.model):
        raise UserError(f"model {opts.model} has no served version in {repo} (policy {entry.get('policy')}, "
                        f"version {served}); export one first")
    report.served_version = served
    info, served_vocab = read_model_info(repo, opts.model, served), read_vocab(repo, opts.model, served)
    out.mkdir(parents=True, exist_ok=True)
    events_csv, train_csv = out / "events.csv", out / "train.csv"
    try:
        with report.stage("export"):
            exported = commands.export_store(opts.store, events_csv, opts.store_password_file, opts.store_ca_file)
            report.store = exported.get("store", "")
        with report.stage("split"):
            split = split_events(events_csv, train_csv, opts.cutoff_ms)
            report.sizes, report.cutoff_ms = split.sizes, split.cutoff_ms
        with report.stage("train"):
            trained = _train(opts, info, served_vocab, train_csv, out, report, log)
        with report.stage("evaluate"):
            from training.checkpoint import load_checkpoint
            report.served = score_version(version_dir(repo, opts.model, served), served_vocab, info.window, split)
            report.candidate = score_model(load_checkpoint(trained.run / "fold-0").model, trained.vocab,
                                           trained.window, split)
        better = report.candidate["log_loss"] < report.served["log_loss"] - opts.margin
        if better:
            with report.stage("export_candidate"):
                from export.exporter import export_run
                candidate_repo = out / "candidate"
                result = export_run(trained.run, candidate_repo, name=opts.model, backend=info.backend or "python",
                                    log=lambda *_: None)
                candidate_dir = version_dir(candidate_repo, opts.model, result.version)
    finally:
        if not opts.keep_data:
            for path in (events_csv, train_csv):
                path.unlink(missing_ok=True)
    if not better:
        report.decision = (f"not better: held-out log loss {report.candidate['log_loss']:.4f} is not below the served "
                           f"version's {report.served['log_loss']:.4f} - margin {opts.margin:g}; nothing published")
        report.seconds["total"] = round(time.perf_counter() - started, 2)
        return NOT_BETTER
    with report.stage("publish"):
        report.new_version = _publish_and_canary(opts, entry, served, candidate_repo, candidate_dir, report, log)
    shutil.rmtree(candidate_repo, ignore_errors=True)
    report.decision = (f"published version {report.new_version} as a canary at weight {opts.weight:g} over "
                       f"version {served}")
    report.seconds["total"] = round(time.perf_counter() - started, 2)
    return PUBLISHED


def _train(opts: RetrainOptions, info, served_vocab, train_csv: Path, out: Path, report: Report, log):
    from export.retrain_train import build_config, train
    from export.retrain_warm import find_served_run
    served_fold = find_served_run(opts.runs, info)
    cfg = build_config(info, served_fold, opts.preset, train_csv, opts.epochs, opts.overrides)
    warm_fold = None
    if opts.warm_start:
        if served_fold is None:
            report.warm_start = {"note": f"the served version's run ({info.provenance.get('run_id', '?')}) is not "
                                         f"under {opts.runs}: trained from scratch"}
        elif cfg.preset != info.preset or cfg.data.window != info.window:
            report.warm_start = {"note": "another preset or window than the served version's: trained from scratch"}
        else:
            warm_fold = served_fold
    trained = train(cfg, served_vocab, out, warm_fold, log)
    report.vocab = trained.vocab_growth
    if trained.warm:
        report.warm_start = trained.warm
    report.training = {"preset": cfg.preset, "epochs_run": trained.result.get("epochs_run"),
                       "best_epoch": trained.result.get("best_epoch"), "valid_auc": trained.result.get("valid_auc"),
                       "device": cfg.train.device.value}
    return trained


def _publish_and_canary(opts: RetrainOptions, entry: dict, served: int, candidate_repo: Path, candidate_dir: Path,
                        report: Report, log) -> int:
    """Pin the served version when the policy is `latest` (so the new version takes no traffic on appearing),
    publish atomically, wait for the gateway to load it (--gateway), then the canary. Any failure removes
    the published version and restores the policy file's previous content."""
    from export.repository import publish_version
    repo = Path(opts.repository)
    policy_before = opts.policy_file.read_bytes() if opts.policy_file.is_file() else None
    new_version = None
    try:
        if entry.get("policy") == "latest":
            commands.set_policy(opts.model, opts.policy_file, "pinned", "--version", str(served))
        files = {p.name: p for p in candidate_dir.iterdir() if p.is_file()}
        keep = max(3, len([v for v in list_versions(repo, opts.model) if v >= served]) + 1)   # never the served one
        config_text, report.config = _config(repo / opts.model / CONFIG_FILE, candidate_repo / opts.model / CONFIG_FILE)
        new_version = publish_version(repo, opts.model, files, config_text, keep_versions=keep)
        if opts.gateway:
            waited = commands.wait_loaded(opts.gateway, opts.model, new_version, opts.load_timeout_s,
                                          opts.gateway_ca_file)
            report.seconds["load"] = round(waited, 2)
        report.policy = commands.set_policy(opts.model, opts.policy_file, "canary", "--baseline", str(served),
                                            "--candidate", str(new_version), "--weight", str(opts.weight))
        return new_version
    except BaseException:
        if new_version is not None:
            _unpublish(repo, opts.model, new_version)
        _restore(opts.policy_file, policy_before)
        raise


def _config(served: Path, candidate: Path) -> tuple[str, str]:
    """The config.pbtxt to publish with: the served one, unchanged, when the new version's vocabulary sizes fit
    its limits (Triton then loads the new version beside the others), else the new one. A changed config makes
    Triton reload every version, and Triton 2.51's python backend can crash when that happens under load
    (docs/learning-loop.md, "Publishing")."""
    from export.triton_config import PARAM_N_QUESTIONS, PARAM_N_SKILLS
    from routerkt.contract.repository import parse_triton_config
    try:
        old, new = parse_triton_config(served.read_text()), parse_triton_config(candidate.read_text())
        fits = all(int(new.parameters[k].string_value) <= int(old.parameters[k].string_value)
                   for k in (PARAM_N_QUESTIONS, PARAM_N_SKILLS))
        same_inputs = all([(t.name, tuple(t.dims)) for t in getattr(old, side)] ==
                          [(t.name, tuple(t.dims)) for t in getattr(new, side)] for side in ("input", "output"))
    except (OSError, KeyError, ValueError, UserError):
        fits = same_inputs = False
    if fits and same_inputs and old.backend == new.backend:
        return served.read_text(), "kept (the served config; Triton loads only the new version)"
    return candidate.read_text(), "replaced (the vocabulary grew: Triton reloads every version of the model)"


def _unpublish(repository: Path, model: str, version: int) -> None:
    """Take a version back out of the repository in one rename (Triton sees it whole or not at all)."""
    trash = Path(tempfile.mkdtemp(prefix=f".{repository.resolve().name}.unpublish-", dir=repository.resolve().parent))
    try:
        os.rename(repository / model / str(version), trash / str(version))
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def _restore(policy_file: Path, before: bytes | None) -> None:
    if before is None:
        policy_file.unlink(missing_ok=True)
    else:
        atomic_write_bytes(policy_file, before)


def write_report(report: Report, out: Path) -> str:
    """report.json and report.txt in `out`; returns the table."""
    from dataclasses import asdict
    table = render(report)
    atomic_write_json(Path(out) / "report.json", asdict(report))
    atomic_write_bytes(Path(out) / "report.txt", table.encode())
    return table


def render(report: Report) -> str:
    s = report.sizes
    lines = [f"retrain of {report.model} from the {report.store or '?'} store; served version {report.served_version}",
             f"events {s.get('events', 0):,} of {s.get('learners', 0):,} learners; cutoff {report.cutoff_ms}: "
             f"train {s.get('train_events', 0):,} events ({s.get('train_learners', 0):,} learners), held out "
             f"{s.get('heldout_events', 0):,} ({s.get('heldout_learners', 0):,} learners)",
             f"vocabulary: {report.vocab.get('questions', 0)} questions ({report.vocab.get('new_questions', 0)} new), "
             f"{report.vocab.get('skills', 0)} skills ({report.vocab.get('new_skills', 0)} new); warm start: "
             f"{_warm_text(report.warm_start)}",
             "", f"{'held-out events':<24}{'AUC':>8}{'log loss':>10}{'Brier':>8}"]
    for name, m in ((f"served v{report.served_version}", report.served), ("new", report.candidate)):
        if m:
            lines.append(f"{name:<24}{m['auc']:>8.4f}{m['log_loss']:>10.4f}{m['brier']:>8.4f}")
    lines += ["", "seconds: " + ", ".join(f"{k} {v}" for k, v in report.seconds.items()), report.decision]
    if report.config:
        lines.append(f"config.pbtxt: {report.config}")
    if report.policy:
        lines.append(f"policy: {report.policy}")
    return "\n".join(lines) + "\n"


def _warm_text(warm: dict | None) -> str:
    if not warm:
        return "off"
    if "note" in warm:
        return warm["note"]
    return (f"from run {warm['from']} ({warm['copied']} tensors copied, {warm['row_mapped']} question/skill tables "
            f"row by row, {len(warm['fresh'])} fresh)")
