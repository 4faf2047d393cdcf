"""`routerkt bench incremental`: Predict by learner_id with the learner-state cache on vs off vs the same
history sent in the request (stateless, and stateless on the prefix cache), side by side in one run
(issue 50; docs/benchmarks.md).

`routerkt serve` children over the repository (its model exported with --step-graphs), in-process
onnxruntime (`--backend onnxruntime`, the default) or both on one tritonserver started here (`--backend
triton`: the rank model runs the step graphs, each learner's state sent with the request), each with its
own SQLite store and outcome tracking off: one with --state-cache-mb
(on), one with 0 (off; it also answers the stateless calls). For every history length (10, 50, 99,
300) `--learners` simulated learners (the vocabulary's questions with their skills, seeded answers) are
observed into both stores; every one is predicted once on each path (the cache filled, and the
probabilities of the paths compared: max |diff|). The cache-on gateway also runs --prefix-cache ("prefix": the
stateless call sent to it). Then closed-loop phases, `--seconds` each, of 1 / 8 / 32 callers calling one
path on a random learner of that length with C = 1 or 20 candidates: calls/s, p50 / p99, on/stateless
and prefix/stateless. Last, the session pattern, three times: each caller takes a learner (new or
returning), answers a burst of `--burst` questions (Predict by learner_id, or with the history the caller
keeps, then Observe the answer) and leaves, on the cache-on gateway (Observe fills the cached states), on
a third gateway with the cache and --no-fill-on-observe (idle until then), and stateless on the prefix
cache, with 1 and 8 callers, the three taking turns in 2 rounds: Predict's and Observe's p50 / p99, the
gateway's CPU per answer, the hit rate (routerkt_state_lookups_total) and the fills
(routerkt_state_fills_total). `--pattern stored|real` runs instead learners who already have a history
(stored: --histories long; real: placed at answer positions drawn from a real dataset), Predict by
learner_id then Observe vs the same sent statelessly (loadtest/bench/stored_pattern.py).
Writes OUT/incremental.json.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from loadtest.bench import stored_pattern
from loadtest.closed_loop import process_cpu_s, run_phase, summary
from loadtest.harness import GatewayProcess, add_common_flags, start_triton, stop_children_on_sigterm
from loadtest.learners import load_vocabulary
from routerkt.atomic import atomic_write_json
from routerkt.contract.model_info import ModelInfo
from routerkt.contract.repository_reader import version_dir
from routerkt.contract.signature import INFO_FILE
from routerkt.errors import UserError
from training.data.pipeline import DATA_ROOT

HISTORIES = (10, 50, 99, 300)
CANDIDATES = (1, 20)
CALLERS = (1, 8, 32)
SESSION_CALLERS = (1, 8)
MODES = ("on", "off", "stateless", "prefix")
RESULTS = ("hit", "appended", "miss", "stale")
FILLS = ("filled", "dropped", "superseded", "skipped", "failed")
BACKENDS = ("onnxruntime", "triton")
PATTERNS = ("all", "stored", "real")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "incremental")
    p.add_argument("--learners", type=int, default=64, help="stored learners per history length")
    p.add_argument("--seconds", type=float, default=3.0, help="length of each closed-loop phase")
    p.add_argument("--cache-mb", type=float, default=256.0, help="--state-cache-mb of the cache-on gateway")
    p.add_argument("--burst", type=int, default=10, help="answers per visit in the session pattern")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve-config", type=Path, default=None, metavar="TOML",
                   help="a `routerkt serve --config` file every gateway starts with (e.g. step_batch_rows = 1)")
    p.add_argument("--backend", choices=BACKENDS, default=BACKENDS[0],
                   help="the gateways' inference: in-process onnxruntime, or one tritonserver started here")
    p.add_argument("--histories", default=",".join(map(str, HISTORIES)), help="history lengths, comma-separated")
    p.add_argument("--callers", default=",".join(map(str, CALLERS)), help="caller counts, comma-separated")
    p.add_argument("--pattern", choices=PATTERNS, default=PATTERNS[0],
                   help="all: the phases and session pattern above; stored: learners with --histories answers stored, "
                        "Predict by learner_id then Observe vs the same sent statelessly; real: the same on learners "
                        "placed at answer positions drawn from --dataset (loadtest/bench/stored_pattern.py)")
    p.add_argument("--dataset", default="assist2017", help="--pattern real: a dataset under --root, or a CSV path")
    p.add_argument("--root", default=str(DATA_ROOT), help="datasets folder (default ../shared/datasets)")


class Bench:
    """The two gateways, their stubs and the stored learners."""

    def __init__(self, args: argparse.Namespace, stack: ExitStack) -> None:
        import grpc

        from serving.api import knowledge_tracing_pb2 as pb
        from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
        self.pb, self.args = pb, args
        self.vocabulary = load_vocabulary(args.repository, args.model)
        self.model = self.vocabulary.model
        info = ModelInfo.load(version_dir(args.repository, self.model, self.vocabulary.version) / INFO_FILE)
        if info.step_state is None:
            raise UserError(f"model {self.model!r} version {self.vocabulary.version} has no step graphs: export it "
                            "with a plain `routerkt export` (no --no-step-graphs)")
        self.gateways, self.stubs = {}, {}
        backend = ["--backend", "onnxruntime"] if args.backend == "onnxruntime" else [
            "--backend", "triton", "--triton-url", start_triton(stack, args.repository.resolve(), args.out).grpc_url]
        for mode, budget, flags in (("on", args.cache_mb, ["--prefix-cache"]), ("off", 0.0, []),
                                    ("nofill", args.cache_mb, ["--no-fill-on-observe"])):
            folder = args.out / f"gateway-{mode}"
            for stale in folder.glob("sessions.sqlite3*"):
                stale.unlink()
            gateway = GatewayProcess(args.repository.resolve(), folder, [
                *backend, "--store", f"sqlite:///{folder / 'sessions.sqlite3'}",
                "--state-cache-mb", f"{budget:g}", "--no-track-outcomes", *flags,
                *(["--config", str(args.serve_config.resolve())] if args.serve_config else [])])
            gateway.start()
            stack.callback(gateway.stop)
            self.gateways[mode] = gateway.wait_serving()
            channel = stack.enter_context(grpc.insecure_channel(gateway.address))
            self.stubs[mode] = pb_grpc.KnowledgeTracingServiceStub(channel)
        self.stubs["stateless"], self.stubs["prefix"] = self.stubs["off"], self.stubs["on"]
        self.rng = random.Random(args.seed)
        self.histories: dict[str, list] = {}

    def interaction(self) -> tuple[int, int]:
        """(question, correct): the skills are the question's, looked up by the gateway on both paths."""
        return self.rng.choice(self.vocabulary.questions), self.rng.randint(0, 1)

    def observe(self, learner: str, items: list[tuple[int, int]], first: int = 0) -> None:
        """Store `items` for `learner` in both stores (events of at most 100 per call)."""
        pb = self.pb
        for start in range(0, len(items), 100):
            events = [pb.Event(event_id=f"{learner}-{first + start + i}", question_id=q, correct=c,
                               timestamp_ms=1 + first + start + i) for i, (q, c) in enumerate(items[start:start + 100])]
            for mode in ("on", "off"):
                self.stubs[mode].Observe(pb.ObserveRequest(learner_id=learner, events=events), timeout=30)

    def request(self, mode: str, learner: str, candidates: list[str]):
        pb = self.pb
        wanted = [pb.Candidate(question_id=q) for q in candidates]
        if mode in ("stateless", "prefix"):
            return pb.PredictRequest(model=self.model, candidates=wanted, history=[
                pb.Interaction(question_id=q, correct=c) for q, c in self.histories[learner]])
        return pb.PredictRequest(model=self.model, learner_id=learner, candidates=wanted)

    def predict(self, mode: str, learner: str, candidates: list[str]) -> np.ndarray:
        return np.asarray(self.stubs[mode].Predict(self.request(mode, learner, candidates), timeout=30).probabilities)

    def lookups(self, key: str = "learner", gateway: str = "on") -> dict[str, float]:
        return {r: self.gateways[gateway].metric("routerkt_state_lookups_total", key=key, result=r) for r in RESULTS}

    def fills(self, gateway: str) -> dict[str, float]:
        return {r: self.gateways[gateway].metric("routerkt_state_fills_total", result=r) for r in FILLS}


def _store_learners(bench: Bench, length: int) -> tuple[list[str], float]:
    """`--learners` learners of `length` answers in both stores, each predicted once on every path
    (filling the cache); the largest |difference| between the paths' probabilities."""
    learners, gap = [], 0.0
    for k in range(bench.args.learners):
        learner = f"bench-{length}-{k}"
        bench.histories[learner] = [bench.interaction() for _ in range(length)]
        bench.observe(learner, bench.histories[learner])
        candidates = [bench.rng.choice(bench.vocabulary.questions) for _ in range(20)]
        probs = [bench.predict(mode, learner, candidates) for mode in MODES]
        gap = max([gap] + [float(np.abs(probs[k] - probs[2]).max()) for k in (0, 1, 3)])
        learners.append(learner)
    return learners, gap


def _phases(bench: Bench, length: int, learners: list[str], callers_list: list[int]) -> list[dict]:
    rows = []
    for n_candidates in CANDIDATES:
        for callers in callers_list:
            row = {"history": length, "candidates": n_candidates, "callers": callers}
            for mode in MODES:
                local = threading.local()

                def call(mode=mode) -> None:
                    rng = getattr(local, "rng", None)
                    if rng is None:
                        rng = local.rng = random.Random()
                    candidates = [rng.choice(bench.vocabulary.questions) for _ in range(n_candidates)]
                    bench.stubs[mode].Predict(bench.request(mode, rng.choice(learners), candidates), timeout=30)
                gateway = bench.gateways[{"stateless": "off", "prefix": "on"}.get(mode, mode)]
                cpu = process_cpu_s(gateway.process.pid), time.process_time()
                row[mode] = summary(*run_phase(call, callers, bench.args.seconds))
                calls = max(row[mode]["calls"], 1)
                row[mode]["gateway_cpu_ms_per_call"] = (process_cpu_s(gateway.process.pid) - cpu[0]) * 1e3 / calls
                row[mode]["client_cpu_ms_per_call"] = (time.process_time() - cpu[1]) * 1e3 / calls
            row["on_vs_stateless"] = row["on"]["calls_per_s"] / max(row["stateless"]["calls_per_s"], 1e-9)
            row["on_vs_off"] = row["on"]["calls_per_s"] / max(row["off"]["calls_per_s"], 1e-9)
            row["prefix_vs_stateless"] = row["prefix"]["calls_per_s"] / max(row["stateless"]["calls_per_s"], 1e-9)
            rates = " ".join(f"{mode} {row[mode]['calls_per_s']:.1f}" for mode in MODES)
            print(f"history {length:>3} C={n_candidates:>2} callers {callers:>2}: calls/s {rates}", file=sys.stderr)
            rows.append(row)
    return rows


SESSION_ROUNDS = 2        # the session pattern's gateways take turns, round by round (the machine's drift shared)


def _sessions(bench: Bench, callers: int) -> list[dict]:
    """The session pattern with `callers` callers on each of: learner keys with Observe's fill (on), without
    (nofill), and stateless on the prefix cache; SESSION_ROUNDS interleaved rounds, merged."""
    kinds = ((False, "on"), (False, "nofill"), (True, "on"))
    rounds = [[_session_round(bench, callers, stateless, gateway, r) for stateless, gateway in kinds]
              for r in range(SESSION_ROUNDS)]
    return [_merged([rounds[r][k] for r in range(SESSION_ROUNDS)]) for k in range(len(kinds))]


def _session_round(bench: Bench, callers: int, stateless: bool, gateway: str, round_: int) -> dict:
    """Learners answer bursts then leave: Predict by learner_id (4 candidates) + Observe, on `gateway` (on:
    Observe fills the cache, nofill: --no-fill-on-observe); or (`stateless`) Predict with the history the
    caller keeps, on the prefix cache, + Observe."""
    key = "history" if stateless else "learner"
    before, fills_before = bench.lookups(key, gateway), bench.fills(gateway)
    pb, stub = bench.pb, bench.stubs[gateway]
    lock, counter = threading.Lock(), iter(range(10**9))
    observe_s: list[float] = []
    predict_s: list[float] = []
    returning: list[tuple[str, int]] = []
    kept: dict[str, list] = {}

    def visit() -> None:
        with lock:
            learner, seen = (returning.pop(0) if returning and bench.rng.random() < 0.5
                             else (f"{key}-{callers}-{round_}-session-{next(counter)}", 0))
        rng = random.Random(f"{learner}-{seen}")
        history = kept.setdefault(learner, [])
        for _ in range(bench.args.burst):
            candidates = [pb.Candidate(question_id=rng.choice(bench.vocabulary.questions)) for _ in range(4)]
            named = {"history": history} if stateless else {"learner_id": learner}
            started = time.perf_counter()
            stub.Predict(pb.PredictRequest(model=bench.model, candidates=candidates, **named), timeout=30)
            predicted = time.perf_counter()
            history.append(pb.Interaction(question_id=candidates[0].question_id, correct=rng.randint(0, 1)))
            stub.Observe(pb.ObserveRequest(learner_id=learner, events=[pb.Event(
                event_id=f"{learner}-{seen}", question_id=candidates[0].question_id, correct=history[-1].correct,
                timestamp_ms=1 + seen)]), timeout=30)
            with lock:
                predict_s.append(predicted - started)
                observe_s.append(time.perf_counter() - predicted)
            seen += 1
        with lock:
            returning.append((learner, seen))

    cpu = process_cpu_s(bench.gateways[gateway].process.pid)
    latencies, failures, wall = run_phase(visit, callers, bench.args.seconds * 4 / SESSION_ROUNDS)
    cpu = process_cpu_s(bench.gateways[gateway].process.pid) - cpu
    after, fills = bench.lookups(key, gateway), bench.fills(gateway)
    return {"key": key, "gateway": gateway, "callers": callers, "burst": bench.args.burst, "visits": len(latencies),
            "failures": len(failures), "lookups": {r: after[r] - before[r] for r in RESULTS},
            "fills": {r: fills[r] - fills_before[r] for r in FILLS}, "predict_s": predict_s,
            "observe_s": observe_s, "cpu_s": cpu, "wall_s": wall}


def _merged(rounds: list[dict]) -> dict:
    """One row of the session table from its rounds."""
    first = rounds[0]
    predict_s = [v for r in rounds for v in r["predict_s"]]
    wall, cpu = sum(r["wall_s"] for r in rounds), sum(r["cpu_s"] for r in rounds)
    predict = summary(predict_s, [], wall)
    observe = summary([v for r in rounds for v in r["observe_s"]], [], wall)
    counts = {k: sum(r["lookups"][k] for r in rounds) for k in RESULTS}
    total = sum(counts.values()) or 1.0
    return {"key": first["key"], "gateway": first["gateway"], "callers": first["callers"], "burst": first["burst"],
            "rounds": len(rounds), "visits": sum(r["visits"] for r in rounds),
            "failures": sum(r["failures"] for r in rounds), "lookups": counts,
            "hit_rate": (counts["hit"] + counts["appended"]) / total,
            "fills": {k: sum(r["fills"][k] for r in rounds) for k in FILLS},
            "predict_p50_ms": predict["p50_ms"], "predict_p99_ms": predict["p99_ms"],
            "observe_p50_ms": observe["p50_ms"], "observe_p99_ms": observe["p99_ms"],
            "answers_per_s": predict["calls_per_s"],
            "gateway_cpu_ms_per_answer": cpu * 1e3 / max(len(predict_s), 1)}


def run(args: argparse.Namespace) -> int:
    if args.learners < 1 or args.seconds <= 0 or args.burst < 1 or args.cache_mb <= 0:
        raise UserError("--learners, --seconds, --burst and --cache-mb must be positive")
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": args.seconds,
                    "learners": args.learners, "cache_mb": args.cache_mb, "backend": args.backend, "phases": [],
                    "max_abs_diff": {}}
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)
        bench = Bench(args, stack)
        report["model"] = bench.model
        if args.pattern != "all":
            report["patterns"] = _stored_patterns(bench, args)
            stored_pattern.print_rows(report["patterns"])
            atomic_write_json(args.out / "incremental.json", report)
            return 0
        for length in _ints(args.histories, "--histories"):
            learners, gap = _store_learners(bench, length)
            report["max_abs_diff"][str(length)] = gap
            report["phases"] += _phases(bench, length, learners, _ints(args.callers, "--callers"))
        report["sessions"] = [row for callers in SESSION_CALLERS for row in _sessions(bench, callers)]
        report["cache_bytes"] = bench.gateways["on"].metric("routerkt_state_cache_bytes")
        report["cached_learners"] = bench.gateways["on"].metric("routerkt_state_cache_learners")
    _print(report)
    atomic_write_json(args.out / "incremental.json", report)
    return 0


def _stored_patterns(bench: Bench, args: argparse.Namespace) -> list[dict]:
    """--pattern stored (every --histories length) or real (--dataset), at every --callers count."""
    callers = _ints(args.callers, "--callers")
    if args.pattern == "real":
        from training.paper.reproduce import dataset_file
        path = Path(args.dataset) if Path(args.dataset).is_file() else dataset_file(Path(args.root), args.dataset)
        learners, facts = stored_pattern.real(bench, path, args.seed)
        print(f"real pattern: {facts}", file=sys.stderr)
        return [{**row, **facts} for row in stored_pattern.run_pattern(bench, "real", learners, callers, args.seconds)]
    rows = []
    for length in _ints(args.histories, "--histories"):
        rows += stored_pattern.run_pattern(bench, f"stored {length}", stored_pattern.stored(bench, length), callers,
                                           args.seconds)
    return rows


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UserError(f"{flag} must be positive integers, comma-separated, got {text!r}")
    return values


def _print(report: dict) -> None:
    print(f"model {report['model']} on {report['backend']}, {report['learners']} learners per history, "
          f"{report['seconds']:g} s per phase, {report['cpus']} CPUs")
    print("max |P by learner_id or prefix - P stateless| per history:",
          ", ".join(f"{h}: {d:.1e}" for h, d in report["max_abs_diff"].items()))
    names = "/".join(MODES)
    print(f"| history | C | callers | on calls/s | off calls/s | stateless calls/s | prefix calls/s | on/stateless "
          f"| on/off | prefix/stateless | p50 {names} ms | p99 {names} ms | gateway CPU ms/call {names} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in report["phases"]:
        p50 = "/".join(f"{r[m]['p50_ms']:.1f}" for m in MODES)
        p99 = "/".join(f"{r[m]['p99_ms']:.1f}" for m in MODES)
        cpu = "/".join(f"{r[m]['gateway_cpu_ms_per_call']:.2f}" for m in MODES)
        rates = " | ".join(f"{r[m]['calls_per_s']:.1f}" for m in MODES)
        print(f"| {r['history']} | {r['candidates']} | {r['callers']} | {rates} | {r['on_vs_stateless']:.2f} | "
              f"{r['on_vs_off']:.2f} | {r['prefix_vs_stateless']:.2f} | {p50} | {p99} | {cpu} |")
    print(f"session pattern (bursts of {report['sessions'][0]['burst']}, half the visits by returning learners):")
    print("| callers | keys | gateway | visits | answers/s | Predict p50 / p99 ms | Observe p50 / p99 ms "
          "| gateway CPU ms/answer | hit rate | lookups | fills |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in report["sessions"]:
        fills = {r: int(n) for r, n in s["fills"].items() if n}
        lookups = {r: int(n) for r, n in s["lookups"].items() if n}
        print(f"| {s['callers']} | {s['key']} | {s['gateway']} | {s['visits']} | {s['answers_per_s']:.1f} | "
              f"{s['predict_p50_ms']:.2f} / "
              f"{s['predict_p99_ms']:.2f} | {s['observe_p50_ms']:.2f} / {s['observe_p99_ms']:.2f} | "
              f"{s['gateway_cpu_ms_per_answer']:.2f} | {s['hit_rate']:.3f} | {lookups} | {fills} |")
    print(f"cache {report['cache_bytes'] / 2**20:.1f} MiB for {report['cached_learners']:.0f} learner states")
