"""`routerkt bench loop`: a dataset replayed day by day through the real gateway, a nightly retrain, vs a static v1.

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
the rollout policy names; v1 leaves the policy once a canary over it is promoted). It gets the same
events the store holds for the learner, so it sees the same window as the served call: for every call
v1 answered on the served side the two probabilities agree (the `v1 parity` column of loop.json).

Prints the table (per day: answers, online log loss and AUC of what was served vs static v1, the
versions that answered, the canary's sequential test, the night's retrain, its seconds, failed
calls) and writes OUT/loop.json and OUT/loop.md; everything else (repository, runs, store, logs)
goes to OUT/work/.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from loadtest.harness import ROUTERKT, GatewayProcess, add_common_flags, stop_children_on_sigterm
from loadtest.loop_replay import Histories, replay_day
from loadtest.loop_report import canary_text, machine, number, per_version, quality, retrain_text, shares, write_report
from loadtest.replay_days import Answer, read_learners, resolve_data, schedule, write_canonical
from routerkt.errors import UserError

MODEL = "kt"
MARKER = ".routerkt-bench-loop"          # a work folder holding it may be emptied by the next run
# v1's model (retrain trains each new version with the configuration of the run it warm-starts from):
# a small routerkt-akt so that a night's retrain takes about a minute on 2 cores; a window model (its static
# arm replays the served window: v1_parity), as in the loop's table of docs/benchmarks.md
SMALL_MODEL = ["model.d_model=32", "model.n_heads=4", "model.n_blocks=1", "model.d_ff=64", "model.final_fc=64",
               "model.final_fc2=32", "train.batch_size=64", "train.lr=3e-3", "model.context=window",
               "data.protocol=chunks"]
FULL = {"learners": 400, "days": 10, "epochs": 5}
QUICK = {"learners": 40, "days": 3, "epochs": 1}
RETRAIN_TIMEOUT_S = 1800.0


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


@dataclass
class Loop:
    """What the days and nights of one run share: the settings, the work folder, both gateways, the histories."""
    args: argparse.Namespace
    chosen: dict[str, int]
    work: Path
    gateway: GatewayProcess                  # the served side: Triton, the SQLite store, the rollout policy
    frozen: GatewayProcess                   # the static v1 arm
    histories: Histories

    @property
    def repository(self) -> Path:
        return self.work / "repository"

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    @property
    def store(self) -> Path:
        return self.work / "sessions.sqlite3"


def run(args: argparse.Namespace) -> int:
    from routerkt.contract.repository_reader import read_model_info
    chosen = _settings(args)
    args.out.mkdir(parents=True, exist_ok=True)
    work = _work_folder(args.out)
    started = time.perf_counter()
    learners = read_learners(args.data, chosen["learners"], args.seed)
    days = schedule(learners, chosen["days"], args.per_day, args.seed)
    overrides = SMALL_MODEL + list(args.overrides)
    print(f"{len(learners)} learners of {args.data}: day 0 {sum(map(len, days[0])):,} answers (v1 trains on "
          f"them), days 1-{chosen['days']} {sum(sum(map(len, d)) for d in days[1:]):,}", file=sys.stderr)
    train_s, export_s = _train_v1(args, chosen, work, days[0], overrides)
    repo = work / "repository"
    static_repo = work / "static-repository"
    shutil.copytree(repo, static_repo)
    window = read_model_info(repo, MODEL, 1).window

    report: dict[str, object] = {
        "command": _command(args, chosen),
        "data": str(args.data), "learners": len(learners), "days": chosen["days"], "per_day": args.per_day,
        "epochs": chosen["epochs"], "seed": args.seed, "callers": args.callers, "preset": args.preset,
        "weight": args.weight, "overrides": overrides, "machine": machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "v1": {"answers": sum(map(len, days[0])), "train_s": round(train_s, 1), "export_s": round(export_s, 1)},
        "rows": []}
    rows: list[dict] = report["rows"]                                     # type: ignore[assignment]
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)
        gateway, frozen = _start_gateways(stack, args, chosen, work, static_repo)
        loop = Loop(args, chosen, work, gateway, frozen, Histories(window))
        zero = asyncio.run(replay_day(gateway.address, frozen.address, MODEL, days[0], loop.histories, args.callers,
                                      predict=False))
        if sum(zero.failed.values()):
            raise UserError(f"observing day 0 failed: {zero.errors[:3]}")
        for day in range(1, chosen["days"] + 1):
            row, night_code = _day(loop, day, days[day])
            rows.append(row)
            write_report(args.out, report, rows)
            if night_code == 2:
                night = row["retrain"]
                raise UserError(f"the retrain of night {day} failed (log {night['log']}): {night.get('error', '')}")
    report["seconds"] = round(time.perf_counter() - started, 1)
    table = write_report(args.out, report, rows)
    print(table, end="")
    return 0 if report["totals"]["failed_calls"] == 0 else 1                   # type: ignore[index]


def _train_v1(args: argparse.Namespace, chosen: dict[str, int], work: Path, answers: list[list[Answer]],
              overrides: list[str]) -> tuple[float, float]:
    """Day 0's answers train v1 (`routerkt train --folds 1`), exported into work/repository; (train seconds,
    export seconds)."""
    write_canonical(answers, work / "day0.csv")
    repo, runs = work / "repository", work / "runs"
    v1_command = [*ROUTERKT, "train", "--data", str(work / "day0.csv"), "--preset", args.preset, "--folds", "1",
                  "--epochs", str(chosen["epochs"]), "--out", str(runs / "v1"), "--no-progress",
                  *(f"--set={o}" for o in overrides)]
    code, train_s = _child(v1_command, work / "train-v1.log", RETRAIN_TIMEOUT_S)
    if code != 0:
        raise UserError(f"training v1 failed (exit {code}, log {work / 'train-v1.log'}):\n"
                        f"{_tail(work / 'train-v1.log')}")
    export_command = [*ROUTERKT, "export", "--run", str(runs / "v1"), "--repository", str(repo), "--name", MODEL]
    code, export_s = _child(export_command, work / "export-v1.log", 900)
    if code != 0:
        raise UserError(f"exporting v1 failed (exit {code}, log {work / 'export-v1.log'}):\n"
                        f"{_tail(work / 'export-v1.log')}")
    print(f"v1: trained in {train_s:.0f} s, exported in {export_s:.0f} s", file=sys.stderr)
    return train_s, export_s


def _start_gateways(stack: ExitStack, args: argparse.Namespace, chosen: dict[str, int], work: Path,
                    static_repo: Path) -> tuple[GatewayProcess, GatewayProcess]:
    """(the served gateway: Triton, the SQLite store, the watched rollout policy; the static v1 arm), both
    answering; `stack` stops them."""
    store, policy = work / "sessions.sqlite3", work / "rollout.json"
    keep = max(1000, args.per_day * (chosen["days"] + 1))
    gateway = GatewayProcess(work / "repository", work, [
        "--store", f"sqlite:///{store}", "--rollout-policy", str(policy), "--store-keep", str(keep),
        "--triton-log", str(work / "triton.log")], log_name="gateway.log")
    frozen = GatewayProcess(static_repo, work, ["--backend", "onnxruntime", "--store", "none"],
                            log_name="static-gateway.log")
    for process in (gateway, frozen):
        stack.callback(process.stop)
        process.start()
    for process in (gateway, frozen):
        _wait_answers(process)
    return gateway, frozen


def _day(loop: Loop, day: int, answers: list[list[Answer]]) -> tuple[dict, int]:
    """Day `day` replayed, then the night after it; (the day's row, the night's code: 2 when the retrain
    failed)."""
    gateway = loop.gateway
    entry = _policy(gateway)
    ready = _get_json(gateway, "/readyz").get("models", {}).get(MODEL, [])
    before = _decisions(gateway)
    day_started = time.perf_counter()
    calls = asyncio.run(replay_day(gateway.address, loop.frozen.address, MODEL, answers, loop.histories,
                                  loop.args.callers))
    day_s = time.perf_counter() - day_started
    rollout = _get_json(gateway, "/v1/rollout")
    after = _decisions(gateway)
    decided = {k: after[k] - before[k] for k in after}
    test = rollout.get("sequential_tests", {}).get(MODEL)
    night, night_code = _night(loop, day)
    parity = [abs(served - static) for served, static, version in zip(calls.served, calls.static, calls.version)
              if version == 1]
    row = {"day": day, "answers": sum(map(len, answers)), "learners": len(answers),
           "policy_at_start": entry, "ready_at_start": ready, "seconds": round(day_s, 1),
           "calls": dict(calls.calls), "failed": dict(calls.failed), "failed_calls": sum(calls.failed.values()),
           "errors": calls.errors, "served": quality(calls.correct, calls.served),
           "static_v1": quality(calls.correct, calls.static), "versions": shares(calls.version),
           "per_version": per_version(calls),
           "v1_parity_max_abs": max(parity) if parity else None,
           "sequential_test": test, "decisions": decided, "canary": canary_text(test, decided),
           "retrain": night, "_calls": calls}
    print(f"day {day}: {row['answers']:,} answers in {day_s:.0f} s, served log loss "
          f"{number(row['served']['log_loss'])} vs static v1 {number(row['static_v1']['log_loss'])}, answered by "
          f"{row['versions']}, canary: {row['canary']}; night: {night['outcome']} in {night['seconds']:.0f} s; "
          f"failed calls {row['failed_calls']}", file=sys.stderr)
    return row, night_code


def _night(loop: Loop, day: int) -> tuple[dict, int]:
    """The night after `day`: `routerkt retrain` as the CronJob runs it (the policy read and changed through
    the gateway); its outcome, seconds and report."""
    out, log = loop.runs / f"night-{day:02d}", loop.work / f"retrain-{day:02d}.log"
    command = [*ROUTERKT, "retrain", "--store", f"sqlite:///{loop.store}", "--repository", str(loop.repository),
               "--model", MODEL, "--runs", str(loop.runs), "--out", str(out),
               "--gateway", f"http://127.0.0.1:{loop.gateway.http_port}",
               "--epochs", str(loop.chosen["epochs"]), "--weight", f"{loop.args.weight:g}"]
    code, seconds = _child(command, log, RETRAIN_TIMEOUT_S)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    night = {"exit": code, "outcome": retrain_text(code, report), "seconds": round(seconds, 1), "log": str(log),
             "decision": report.get("decision"), "report_outcome": report.get("outcome"),
             "served_version": report.get("served_version"), "new_version": report.get("new_version"),
             "served": report.get("served", {}), "candidate": report.get("candidate", {}),
             "compared": report.get("compared", {}), "canary_met": report.get("canary"),
             "stages_s": report.get("seconds", {}), "sizes": report.get("sizes", {}), "config": report.get("config")}
    if code not in (0, 3):
        night["error"] = (_tail(log, 600).strip().splitlines() or [""])[-1]
        return night, 2
    night["policy_after"] = _policy(gateway=loop.gateway)
    return night, code
