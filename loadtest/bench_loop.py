"""`routerkt bench loop`: a dataset replayed day by day through the real gateway, the nightly retrain after each day, and what the learners were served against a static v1.

What `routerkt serve` starts runs as a child process on free loopback ports (its tritonserver, the
gateway, a SQLite session store, a watched rollout policy file). The learners of `--data` are
replayed as simulated days (loadtest/replay_days.py: each learner answers its next `--per-day`
interactions a day, in the file's order):

    day 0    its answers train v1 (`routerkt train --folds 1`, then `routerkt export`), then are Observed
    day d    per learner, in order, `--callers` learners at a time: Predict by learner_id (routed by
             the rollout policy: the probability and the version that answered are recorded), the
             static v1 arm's Predict, then Observe the answer (with its timestamp_ms); the gateway's
             outcome tracker joins the first with the answer, which feeds the canary's sequential test
    night d  GET /v1/rollout and /metrics (the sequential test, routerkt_rollout_decisions_total),
             then `routerkt retrain --gateway ...` (the CronJob's command): exit 0 published in canary,
             3 nothing published, 2 an error (the benchmark stops)

The static v1 arm is a second gateway (`routerkt serve --backend onnxruntime --store none`) over a
copy of the repository holding v1 alone, asked statelessly with the learner's explicit history and
`version: 1`: it has no session store, so nothing it answers reaches an outcome tracker or a
sequential test, and no publish can prune v1 under it (a publish keeps the newest versions and those
the rollout policy names; v1 leaves the policy once a canary over it is promoted). It gets the same events the store holds for the learner, so it sees the same window
as the served call: for every call v1 answered on the served side the two probabilities agree (the
`v1 parity` column of loop.json).

Prints the table (per day: answers, online log loss and AUC of what was served vs static v1, the
versions that answered, the canary's sequential test, the night's retrain, its seconds, failed
calls) and writes OUT/loop.json and OUT/loop.md; everything else (repository, runs, store, logs)
goes to OUT/work/.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loadtest.harness import ROUTERKT, GatewayProcess, add_common_flags, stop_children_on_sigterm
from loadtest.replay_days import Answer, read_learners, resolve_data, schedule, write_canonical
from routerkt.atomic import atomic_write_bytes, atomic_write_json
from routerkt.errors import UserError

MODEL = "kt"
MARKER = ".routerkt-bench-loop"          # a work folder holding it may be emptied by the next run
# v1's model (retrain trains each new version with the configuration of the run it warm-starts from):
# a small routerkt-akt so that a night's retrain takes about a minute on 2 cores
SMALL_MODEL = ["model.d_model=32", "model.n_heads=4", "model.n_blocks=1", "model.d_ff=64", "model.final_fc=64",
               "model.final_fc2=32", "train.batch_size=64", "train.lr=3e-3", "data.protocol=chunks"]
FULL = {"learners": 400, "days": 10, "epochs": 5}
QUICK = {"learners": 40, "days": 3, "epochs": 1}
EPS = 1e-7                               # log loss clipping: retrain's and the gateway's
CALL_TIMEOUT_S = 30.0
RETRAIN_TIMEOUT_S = 1800.0
OUTCOMES = {"not_better": "not better", "canary_undecided": "canary undecided", "published": "published"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "loop", model=False)
    p.add_argument("--data", type=Path, default=Path("../shared/datasets/assist2017"),
                   help="canonical CSV, or a dataset folder holding interactions.csv(.gz)")
    p.add_argument("--learners", type=int, default=None, help=f"learners replayed, a seeded sample (default "
                                                               f"{FULL['learners']}; --quick {QUICK['learners']})")
    p.add_argument("--days", type=int, default=None, help=f"simulated days after day 0 (default {FULL['days']}; "
                                                          f"--quick {QUICK['days']})")
    p.add_argument("--per-day", type=int, default=12, help="answers per learner and day (default 12)")
    p.add_argument("--epochs", type=int, default=None, help=f"v1's epochs and each retrain's --epochs (default "
                                                            f"{FULL['epochs']}; --quick {QUICK['epochs']})")
    p.add_argument("--seed", type=int, default=0, help="learner sample and times of day")
    p.add_argument("--callers", type=int, default=8, help="learners replayed at once (concurrent callers)")
    p.add_argument("--preset", default="routerkt-akt", help="v1's preset (the retrains keep it)")
    p.add_argument("--weight", type=float, default=0.5, help="retrain --weight: the canary's share of learners")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="v1's config on top of the small model's (the retrains keep it)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 40 learners, 3 days, 1 epoch (unless given)")


# -- the calls of one day ----------------------------------------------------------------------------
@dataclass
class DayCalls:
    correct: list[int] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    static: list[float] = field(default_factory=list)
    calls: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


class Histories:
    """Each learner's events as the store holds them (oldest first), as pb.Interaction messages."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.events: dict[str, list] = {}

    def add(self, answer: Answer) -> None:
        from serving.api import knowledge_tracing_pb2 as pb
        self.events.setdefault(answer.learner, []).append(
            pb.Interaction(question_id=answer.question, skill_ids=answer.skills, correct=answer.correct))

    def recent(self, learner: str) -> list:
        """The newest `window` events: the gateway's encoder keeps window - 1 of them either way."""
        return self.events.get(learner, [])[-self.window:]


def _event(answer: Answer):
    from serving.api import knowledge_tracing_pb2 as pb
    return pb.Event(event_id=answer.event_id, question_id=answer.question, skill_ids=answer.skills,
                    correct=answer.correct, timestamp_ms=answer.timestamp_ms)


async def _call(calls: DayCalls, name: str, coroutine):
    import grpc
    calls.calls[name] += 1
    try:
        return await coroutine
    except grpc.RpcError as exc:
        calls.failed[name] += 1
        if len(calls.errors) < 20:
            calls.errors.append(f"{name}: {exc.code().name} {str(exc.details())[:200]}")
        return None


async def replay_day(served: str, static: str, day: list[list[Answer]], histories: Histories, callers: int,
                     predict: bool = True) -> DayCalls:
    """Every learner's answers of `day`, `callers` learners at a time: Predict (served, static v1) and Observe
    per answer in order; with `predict` False only the Observe calls (day 0: v1's training day)."""
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
    options = [("grpc.enable_http_proxy", 0)]
    calls = DayCalls()
    queue: asyncio.Queue = asyncio.Queue()
    for answers in day:
        queue.put_nowait(answers)
    async with grpc.aio.insecure_channel(served, options=options) as served_channel, \
            grpc.aio.insecure_channel(static, options=options) as static_channel:
        gateway, frozen = pb_grpc.KnowledgeTracingServiceStub(served_channel), \
            pb_grpc.KnowledgeTracingServiceStub(static_channel)

        async def learner(answers: list[Answer]) -> None:
            if not predict:
                for start in range(0, len(answers), 1000):
                    await _call(calls, "Observe", gateway.Observe(pb.ObserveRequest(
                        learner_id=answers[0].learner, events=[_event(a) for a in answers[start:start + 1000]]),
                        timeout=CALL_TIMEOUT_S))
                for answer in answers:
                    histories.add(answer)
                return
            for answer in answers:
                candidate = pb.Candidate(question_id=answer.question, skill_ids=answer.skills)
                got, base = await asyncio.gather(
                    _call(calls, "Predict", gateway.Predict(pb.PredictRequest(
                        model=MODEL, learner_id=answer.learner, candidates=[candidate]), timeout=CALL_TIMEOUT_S)),
                    _call(calls, "static Predict", frozen.Predict(pb.PredictRequest(
                        model=MODEL, version=1, history=histories.recent(answer.learner), candidates=[candidate]),
                        timeout=CALL_TIMEOUT_S)))
                await _call(calls, "Observe", gateway.Observe(pb.ObserveRequest(
                    learner_id=answer.learner, events=[_event(answer)]), timeout=CALL_TIMEOUT_S))
                histories.add(answer)
                if got is not None and base is not None:
                    calls.correct.append(answer.correct)
                    calls.served.append(float(got.probabilities[0]))
                    calls.version.append(int(got.version))
                    calls.static.append(float(base.probabilities[0]))

        async def caller() -> None:
            while True:
                try:
                    answers = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await learner(answers)
        await asyncio.gather(*(caller() for _ in range(callers)))
    return calls


# -- the servers ----------------------------------------------------------------------------------------
def _wait_answers(gateway: GatewayProcess, timeout_s: float = 240.0) -> None:
    """A stateless Predict of version 1 answers (bounded); UserError otherwise."""
    import grpc

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(gateway.address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)
        while True:
            if gateway.process is None or gateway.process.poll() is not None:
                raise UserError(f"the gateway exited (log {gateway.log}):\n{gateway.tail(1500)}")
            try:
                stub.Predict(pb.PredictRequest(model=MODEL, version=1, candidates=[pb.Candidate(question_id=1)]),
                             timeout=5.0)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise UserError(f"the gateway did not answer within {timeout_s:.0f} s (log {gateway.log})")
                time.sleep(0.5)


def _get_json(gateway: GatewayProcess, path: str) -> dict:
    try:
        status, text = gateway.get(path)
        return json.loads(text)
    except (OSError, ValueError) as exc:
        return {"error": f"GET {path}: {exc}"}


def _policy(gateway: GatewayProcess) -> dict:
    """The model's rollout entry in force at the gateway (retrain changes it through the gateway's API)."""
    entry = _get_json(gateway, "/v1/rollout").get("models", {}).get(MODEL)
    return entry or {"policy": "latest"}


def _decisions(gateway: GatewayProcess) -> dict[str, float]:
    return {"promote": gateway.metric("routerkt_rollout_decisions_total", model=MODEL, decision="promote"),
            "rollback": gateway.metric("routerkt_rollout_decisions_total", model=MODEL, decision="rollback"),
            "guardrail": gateway.metric("routerkt_rollout_rollbacks_total", model=MODEL)}


def _child(command: list[str], log: Path, timeout_s: float) -> tuple[int, float]:
    """(exit code, wall seconds) of one `routerkt` child process, its output in `log`."""
    started = time.perf_counter()
    with open(log, "w") as handle:
        try:
            code = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.perf_counter() - started


def _tail(log: Path, chars: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# -- the table ------------------------------------------------------------------------------------------
def _quality(correct: list[int], probs: list[float]) -> dict[str, float | int | None]:
    """AUC, log loss (p clipped to [EPS, 1 - EPS], as retrain's report and the gateway's outcome metrics) and
    Brier of the probabilities given for these answers."""
    from training.metrics import auc
    if not correct:
        return {"auc": None, "log_loss": None, "brier": None, "n": 0}
    y, p = np.asarray(correct, np.float64), np.asarray(probs, np.float64)
    clipped = np.clip(p, EPS, 1 - EPS)
    area = auc(y, p)
    return {"auc": None if np.isnan(area) else round(area, 4),
            "log_loss": round(float(-np.mean(y * np.log(clipped) + (1 - y) * np.log(1 - clipped))), 4),
            "brier": round(float(np.mean((p - y) ** 2)), 4), "n": int(y.size)}


def _per_version(calls: DayCalls) -> dict[str, dict]:
    """Per version that answered: its answers' quality, and static v1's on the same answers (the same learners)."""
    out = {}
    for version in sorted(set(calls.version)):
        mine = [i for i, v in enumerate(calls.version) if v == version]
        correct = [calls.correct[i] for i in mine]
        out[f"v{version}"] = {"served": _quality(correct, [calls.served[i] for i in mine]),
                              "static_v1": _quality(correct, [calls.static[i] for i in mine])}
    return out


def _shares(versions: list[int]) -> dict[str, float]:
    counts = Counter(versions)
    return {f"v{v}": round(n / len(versions), 3) for v, n in sorted(counts.items())} if versions else {}


def _canary_text(test: dict | None, decided: dict[str, float]) -> str:
    if decided.get("guardrail"):
        return "rolled back (guardrail)"
    if not test:
        return "-"
    pair = f"v{test.get('candidate')} over v{test.get('baseline')}"
    outcomes = test.get("outcomes", {})
    counts = f"{outcomes.get('candidate', 0)}/{outcomes.get('baseline', 0)}"
    if decided.get("promote"):
        return f"{pair}: promoted ({counts})"
    if decided.get("rollback"):
        return f"{pair}: rolled back ({counts})"
    diff = test.get("difference", {})
    return f"{pair}: undecided ({counts}, [{diff.get('lower', 0):+.3f}, {diff.get('upper', 0):+.3f}])"


def _retrain_text(code: int, report: dict) -> str:
    if code == 0:
        return f"published v{report.get('new_version')}"
    if code == 3:
        outcome = report.get("outcome")
        if outcome:
            return OUTCOMES.get(outcome, outcome)
        return "not better" if str(report.get("decision", "")).startswith("not better") else \
            str(report.get("decision", "nothing published"))[:60]
    return f"error (exit {code})"


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{digits}f}"


def _offline_text(night: dict) -> str:
    """" (v1 0.6457, new 0.6274)": the held-out log loss of every version the retrain compared, and the new model's."""
    compared = night.get("compared") or ({str(night.get("served_version")): night["served"]} if night.get("served")
                                         else {})
    if not compared or not night.get("candidate"):
        return ""
    parts = [f"v{v} {_fmt(m.get('log_loss'))}" for v, m in sorted(compared.items(), key=lambda kv: int(kv[0]))]
    return f" ({', '.join(parts)}, new {_fmt(night['candidate'].get('log_loss'))})"


def render(rows: list[dict], totals: dict) -> str:
    lines = ["| day | answers | served log loss | static v1 log loss | served AUC | static v1 AUC | answered by | "
             "canary during the day | night's retrain (held-out log loss) | retrain s | failed calls |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shares = ", ".join(f"{v} {s:.0%}" for v, s in r["versions"].items()) or "-"
        night = r["retrain"]
        offline = _offline_text(night)
        lines.append(f"| {r['day']} | {r['answers']:,} | {_fmt(r['served']['log_loss'])} | "
                     f"{_fmt(r['static_v1']['log_loss'])} | {_fmt(r['served']['auc'])} | {_fmt(r['static_v1']['auc'])} | "
                     f"{shares} | {r['canary']} | {night['outcome']}{offline} | {night['seconds']:.0f} | "
                     f"{r['failed_calls']} |")
    t = totals
    lines.append(f"| all | {t['answers']:,} | {_fmt(t['served']['log_loss'])} | {_fmt(t['static_v1']['log_loss'])} | "
                 f"{_fmt(t['served']['auc'])} | {_fmt(t['static_v1']['auc'])} | "
                 f"{', '.join(f'{v} {s:.0%}' for v, s in t['versions'].items())} | "
                 f"{t['promoted']} promoted, {t['rolled_back']} rolled back | {t['published']} published | "
                 f"{t['retrain_seconds']:.0f} | {t['failed_calls']} |")
    return "\n".join(lines) + "\n"


def _machine() -> dict[str, object]:
    flags: set[str] = set()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "avx512f": "avx512f" in flags, "avx2": "avx2" in flags,
            "python": platform.python_version()}


# -- the run --------------------------------------------------------------------------------------------
def _settings(args: argparse.Namespace) -> dict[str, int]:
    base = QUICK if args.quick else FULL
    chosen = {k: getattr(args, k) if getattr(args, k) is not None else base[k] for k in base}
    if chosen["learners"] < 10 or chosen["days"] < 1 or chosen["epochs"] < 1 or args.per_day < 1 or args.callers < 1:
        raise UserError("--learners must be >= 10; --days, --epochs, --per-day and --callers >= 1")
    if not 0 < args.weight <= 1:
        raise UserError(f"--weight must be in (0, 1], got {args.weight}")
    resolve_data(args.data)                                   # a missing file fails before anything is made
    return chosen


def _command(args: argparse.Namespace, chosen: dict[str, int]) -> str:
    """The command line that repeats this run (every setting spelled out)."""
    words = ["routerkt", "bench", "loop", "--data", str(args.data), "--learners", str(chosen["learners"]), "--days",
             str(chosen["days"]), "--per-day", str(args.per_day), "--epochs", str(chosen["epochs"]), "--seed",
             str(args.seed), "--callers", str(args.callers), "--preset", args.preset, "--weight", f"{args.weight:g}",
             *(f"--set={o}" for o in args.overrides), "--out", str(args.out)]
    return " ".join(words)


def _work_folder(out: Path) -> Path:
    work = out / "work"
    if work.exists():
        if not (work / MARKER).is_file():
            raise UserError(f"{work} exists and was not made by `routerkt bench loop`; move it away")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / MARKER).write_text("the work folder of `routerkt bench loop`: emptied by its next run\n")
    return work


def run(args: argparse.Namespace) -> int:
    from routerkt.contract.repository import read_model_info
    chosen = _settings(args)
    args.out.mkdir(parents=True, exist_ok=True)
    work = _work_folder(args.out)
    started = time.perf_counter()
    learners = read_learners(args.data, chosen["learners"], args.seed)
    days = schedule(learners, chosen["days"], args.per_day, args.seed)
    overrides = SMALL_MODEL + list(args.overrides)
    print(f"{len(learners)} learners of {args.data}: day 0 {sum(map(len, days[0])):,} answers (v1 trains on "
          f"them), days 1-{chosen['days']} {sum(sum(map(len, d)) for d in days[1:]):,}", file=sys.stderr)

    write_canonical(days[0], work / "day0.csv")
    repo, runs = work / "repository", work / "runs"
    v1_command = [*ROUTERKT, "train", "--data", str(work / "day0.csv"), "--preset", args.preset, "--folds", "1",
                  "--epochs", str(chosen["epochs"]), "--out", str(runs / "v1"), "--no-progress",
                  *(f"--set={o}" for o in overrides)]
    code, train_s = _child(v1_command, work / "train-v1.log", RETRAIN_TIMEOUT_S)
    if code != 0:
        raise UserError(f"training v1 failed (exit {code}, log {work / 'train-v1.log'}):\n{_tail(work / 'train-v1.log')}")
    code, export_s = _child([*ROUTERKT, "export", "--run", str(runs / "v1"), "--repository", str(repo), "--name", MODEL],
                            work / "export-v1.log", 900)
    if code != 0:
        raise UserError(f"exporting v1 failed (exit {code}, log {work / 'export-v1.log'}):\n"
                        f"{_tail(work / 'export-v1.log')}")
    print(f"v1: trained in {train_s:.0f} s, exported in {export_s:.0f} s", file=sys.stderr)
    static_repo = work / "static-repository"
    shutil.copytree(repo, static_repo)
    window = read_model_info(repo, MODEL, 1).window

    store, policy = work / "sessions.sqlite3", work / "rollout.json"
    keep = max(1000, args.per_day * (chosen["days"] + 1))
    report: dict[str, object] = {
        "command": _command(args, chosen),
        "data": str(args.data), "learners": len(learners), "days": chosen["days"], "per_day": args.per_day,
        "epochs": chosen["epochs"], "seed": args.seed, "callers": args.callers, "preset": args.preset,
        "weight": args.weight, "overrides": overrides, "machine": _machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "v1": {"answers": sum(map(len, days[0])), "train_s": round(train_s, 1),
                                                           "export_s": round(export_s, 1)},
        "rows": []}
    rows: list[dict] = report["rows"]                                     # type: ignore[assignment]
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)
        gateway = GatewayProcess(repo, work, ["--store", f"sqlite:///{store}", "--rollout-policy", str(policy),
                                              "--store-keep", str(keep), "--triton-log", str(work / "triton.log")],
                                 log_name="gateway.log")
        frozen = GatewayProcess(static_repo, work, ["--backend", "onnxruntime", "--store", "none"],
                                log_name="static-gateway.log")
        for process in (gateway, frozen):
            stack.callback(process.stop)
            process.start()
        for process in (gateway, frozen):
            _wait_answers(process)
        histories = Histories(window)
        zero = asyncio.run(replay_day(gateway.address, frozen.address, days[0], histories, args.callers, predict=False))
        if sum(zero.failed.values()):
            raise UserError(f"observing day 0 failed: {zero.errors[:3]}")
        for day in range(1, chosen["days"] + 1):
            entry = _policy(gateway)
            ready = _get_json(gateway, "/readyz").get("models", {}).get(MODEL, [])
            before = _decisions(gateway)
            day_started = time.perf_counter()
            calls = asyncio.run(replay_day(gateway.address, frozen.address, days[day], histories, args.callers))
            day_s = time.perf_counter() - day_started
            rollout = _get_json(gateway, "/v1/rollout")
            after = _decisions(gateway)
            decided = {k: after[k] - before[k] for k in after}
            test = rollout.get("sequential_tests", {}).get(MODEL)
            night, night_code = _night(args, chosen, work, day, store, repo, runs, gateway)
            parity = [abs(s - b) for s, b, v in zip(calls.served, calls.static, calls.version) if v == 1]
            row = {"day": day, "answers": sum(map(len, days[day])), "learners": len(days[day]),
                   "policy_at_start": entry, "ready_at_start": ready, "seconds": round(day_s, 1),
                   "calls": dict(calls.calls), "failed": dict(calls.failed), "failed_calls": sum(calls.failed.values()),
                   "errors": calls.errors, "served": _quality(calls.correct, calls.served),
                   "static_v1": _quality(calls.correct, calls.static), "versions": _shares(calls.version),
                   "per_version": _per_version(calls),
                   "v1_parity_max_abs": max(parity) if parity else None,
                   "sequential_test": test, "decisions": decided, "canary": _canary_text(test, decided),
                   "retrain": night, "_calls": calls}
            rows.append(row)
            print(f"day {day}: {row['answers']:,} answers in {day_s:.0f} s, served log loss "
                  f"{_fmt(row['served']['log_loss'])} vs static v1 {_fmt(row['static_v1']['log_loss'])}, answered by "
                  f"{row['versions']}, canary: {row['canary']}; night: {night['outcome']} in {night['seconds']:.0f} s; "
                  f"failed calls {row['failed_calls']}", file=sys.stderr)
            _write(args.out, report, rows)
            if night_code == 2:
                raise UserError(f"the retrain of night {day} failed (log {night['log']}): {night.get('error', '')}")
    report["seconds"] = round(time.perf_counter() - started, 1)
    table = _write(args.out, report, rows)
    print(table, end="")
    return 0 if report["totals"]["failed_calls"] == 0 else 1                   # type: ignore[index]


def _night(args, chosen, work: Path, day: int, store: Path, repo: Path, runs: Path,
           gateway: GatewayProcess) -> tuple[dict, int]:
    """The night after `day`: `routerkt retrain` as the CronJob runs it (the policy read and changed through
    the gateway); its outcome, seconds and report."""
    out, log = runs / f"night-{day:02d}", work / f"retrain-{day:02d}.log"
    command = [*ROUTERKT, "retrain", "--store", f"sqlite:///{store}", "--repository", str(repo), "--model", MODEL,
               "--runs", str(runs), "--out", str(out), "--gateway", f"http://127.0.0.1:{gateway.http_port}",
               "--epochs", str(chosen["epochs"]), "--weight", f"{args.weight:g}"]
    code, seconds = _child(command, log, RETRAIN_TIMEOUT_S)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    night = {"exit": code, "outcome": _retrain_text(code, report), "seconds": round(seconds, 1), "log": str(log),
             "decision": report.get("decision"), "report_outcome": report.get("outcome"),
             "served_version": report.get("served_version"), "new_version": report.get("new_version"),
             "served": report.get("served", {}), "candidate": report.get("candidate", {}),
             "compared": report.get("compared", {}), "canary_met": report.get("canary"),
             "stages_s": report.get("seconds", {}), "sizes": report.get("sizes", {}), "config": report.get("config")}
    if code not in (0, 3):
        night["error"] = (_tail(log, 600).strip().splitlines() or [""])[-1]
        return night, 2
    night["policy_after"] = _policy(gateway)
    return night, code


def _write(out: Path, report: dict, rows: list[dict]) -> str:
    correct = [c for r in rows for c in r["_calls"].correct]
    served = [p for r in rows for p in r["_calls"].served]
    static = [p for r in rows for p in r["_calls"].static]
    versions = [v for r in rows for v in r["_calls"].version]
    report["totals"] = totals = {
        "answers": sum(r["answers"] for r in rows), "served": _quality(correct, served),
        "static_v1": _quality(correct, static), "versions": _shares(versions),
        "promoted": int(sum(r["decisions"].get("promote", 0) for r in rows)),
        "rolled_back": int(sum(r["decisions"].get("rollback", 0) + r["decisions"].get("guardrail", 0) for r in rows)),
        "published": sum(1 for r in rows if r["retrain"]["exit"] == 0),
        "retrain_seconds": round(sum(r["retrain"]["seconds"] for r in rows), 1),
        "failed_calls": sum(r["failed_calls"] for r in rows),
        "calls": sum(sum(r["calls"].values()) for r in rows)}
    table = render(rows, totals)
    atomic_write_json(out / "loop.json", {**report, "rows": [{k: v for k, v in r.items() if k != "_calls"}
                                                             for r in rows]})
    atomic_write_bytes(out / "loop.md", (f"`{report['command']}`\n\n" + table).encode())
    return table
