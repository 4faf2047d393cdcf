"""`routerkt bench ceiling`: the gateway's Predict by learner_id on a cache hit against a do-nothing server of the
same gRPC service (loadtest/null_server.py: the ceiling of the gRPC stack), same client, same requests,
rounds interleaved (issue 58; docs/benchmarks.md, "The ceiling").

`routerkt serve` children over the repository (a model with step graphs), one per `--backends` (in-process
onnxruntime; triton: over one tritonserver started here, with held states where the model's config declares
them; triton-sent: over the same Triton, sending the states), each with its SQLite store and outcome tracking
off, and the do-nothing server. `--learners` learners of `--history` answers are stored in every gateway and
predicted once (their states cached; each compared with the same history sent: max |diff|). Then for each
caller count (`--callers`), `--rounds` rounds in which every target runs `--seconds`: the ceiling, Predict
by learner_id (1 candidate, a random stored learner: a hit) and the same Predict with the learner's history
sent (stateless) on every gateway. Reported per target: calls/s, p50 / p99, the server's CPU per call; per
backend: by-id / ceiling (the fraction of the ceiling), by-id / stateless, the lookups, and the step calls per
backend step call (routerkt_step_batch_calls: step batching). Last, the session
pattern (each call a Predict by learner_id, then the Observe of that answer) at 8 callers on every gateway
and the do-nothing server, rounds interleaved. Writes OUT/ceiling.json and prints the tables.

`--gateways N` (N > 1): N gateways per backend, each with its own SQLite store, and N do-nothing servers; the
client reaches them through serving/client.py's LearnerRouter (a learner's calls go to its owner by consistent
hashing, a stateless call to its first candidate's), every arm alike. A server's CPU is the sum over its N.
"""
from __future__ import annotations

import argparse
import itertools
import random
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from loadtest.closed_loop import process_cpu_s, run_phase
from loadtest.harness import GatewayProcess, add_common_flags, start_triton, stop_children_on_sigterm
from loadtest.learners import load_vocabulary
from routerkt.atomic import atomic_write_json
from routerkt.errors import UserError
from serving.processes import free_port

# a gateway per name: its `routerkt serve` flags (triton-sent: Triton without held states, the A/B of them)
BACKENDS = {"onnxruntime": ["--backend", "onnxruntime"], "triton": ["--backend", "triton"],
            "triton-sent": ["--backend", "triton", "--no-held-states"]}
LOOKUPS = ("hit", "appended", "miss", "stale")
BATCHING = ("sum", "count")                 # of routerkt_step_batch_calls: step calls, backend calls


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_flags(p, "ceiling")
    p.add_argument("--backends", default="onnxruntime,triton",
                   help=f"gateways' backends, comma-separated, of {', '.join(BACKENDS)}")
    p.add_argument("--history", type=int, default=99, help="answers stored per learner")
    p.add_argument("--learners", type=int, default=32, help="stored learners")
    p.add_argument("--callers", default="1,8,32", help="caller counts, comma-separated")
    p.add_argument("--seconds", type=float, default=2.0, help="length of each phase")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per caller count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gateways", type=int, default=1,
                   help="gateways per backend and do-nothing servers, the client routing learners among them")
    p.add_argument("--serve-config", type=Path, default=None, metavar="TOML",
                   help="a `routerkt serve --config` file every gateway starts with (e.g. step_batch_rows = 1)")


def _client(addresses: list[str], stack: ExitStack):
    """call(method, request, timeout) on one server (a plain stub) or, with several, through a LearnerRouter."""
    import grpc

    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
    from serving.client import LearnerRouter
    if len(addresses) > 1:
        return stack.enter_context(LearnerRouter(addresses)).call
    stub = pb_grpc.KnowledgeTracingServiceStub(stack.enter_context(grpc.insecure_channel(addresses[0])))
    return lambda method, request, timeout: getattr(stub, method)(request, timeout=timeout)


def _null_servers(n: int, stack: ExitStack) -> tuple[list[str], list[int]]:
    """`n` do-nothing servers (loadtest/null_server.py) serving, stopped with `stack`: their addresses and pids."""
    import grpc
    addresses, pids = [], []
    for _ in range(n):
        port = free_port()
        null = subprocess.Popen([sys.executable, "-m", "loadtest.null_server", "--port", str(port)],
                                stdin=subprocess.DEVNULL, start_new_session=True)
        stack.callback(lambda null=null: (null.terminate(), null.wait(10)))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        addresses.append(f"127.0.0.1:{port}")
        pids.append(null.pid)
    return addresses, pids


class Targets:
    """The gateways and the do-nothing servers, their clients, pids and the stored learners."""

    def __init__(self, args: argparse.Namespace, stack: ExitStack) -> None:
        from serving.api import knowledge_tracing_pb2 as pb
        self.pb, self.args, self.rng = pb, args, random.Random(args.seed)
        self.vocabulary = load_vocabulary(args.repository, args.model)
        self.backends = [b for b in args.backends.split(",") if b]
        if not self.backends or set(self.backends) - set(BACKENDS):
            raise UserError(f"--backends: one or more of {', '.join(BACKENDS)}")
        self.clients, self.pids, self.gateways = {}, {}, {}
        triton = None
        for backend in self.backends:
            flags = list(BACKENDS[backend])
            if "triton" in flags:
                triton = triton or start_triton(stack, args.repository.resolve(), args.out).grpc_url
                flags += ["--triton-url", triton]
            self.gateways[backend] = []
            for k in range(args.gateways):
                folder = args.out / (f"gateway-{backend}" + (f"-{k}" if args.gateways > 1 else ""))
                for old in folder.glob("sessions.sqlite3*"):
                    old.unlink()
                gateway = GatewayProcess(args.repository.resolve(), folder, [
                    *flags, "--store", f"sqlite:///{folder / 'sessions.sqlite3'}", "--no-track-outcomes",
                    *(["--config", str(args.serve_config.resolve())] if args.serve_config else [])]).start()
                stack.callback(gateway.stop)
                self.gateways[backend].append(gateway.wait_serving())
            self.pids[backend] = [g.process.pid for g in self.gateways[backend]]
            self.clients[backend] = _client([g.address for g in self.gateways[backend]], stack)
        addresses, self.pids["ceiling"] = _null_servers(args.gateways, stack)
        self.clients["ceiling"] = _client(addresses, stack)
        self.histories: dict[str, list[tuple[int, int]]] = {}
        self.sent = itertools.count()

    def store(self) -> float:
        """`--learners` learners of `--history` answers in every gateway, each predicted once by id and with its
        history sent; the largest |difference|."""
        pb, gap = self.pb, 0.0
        for k in range(self.args.learners):
            name = f"ceiling-{k}"
            self.histories[name] = [(self.rng.choice(self.vocabulary.questions), self.rng.randint(0, 1))
                                    for _ in range(self.args.history)]
            for backend in self.backends:
                self.observe(backend, name, self.histories[name])
                candidates = [pb.Candidate(question_id=q) for q in self.rng.sample(self.vocabulary.questions, 3)]
                by_id = self.clients[backend]("Predict", pb.PredictRequest(
                    model=self.vocabulary.model, learner_id=name, candidates=candidates), 60)
                sent = self.clients[backend]("Predict", self.request(name, candidates, sent=True), 60)
                gap = max(gap, float(np.abs(np.asarray(by_id.probabilities) - np.asarray(sent.probabilities)).max()))
        return gap

    def observe(self, target: str, name: str, items: list[tuple[int, int]]) -> None:
        pb = self.pb
        for start in range(0, len(items), 100):
            events = [pb.Event(event_id=f"{name}-{next(self.sent)}", question_id=q, correct=c)
                      for q, c in items[start:start + 100]]
            self.clients[target]("Observe", pb.ObserveRequest(learner_id=name, events=events), 60)

    def request(self, name: str, candidates, sent: bool):
        pb = self.pb
        history = [pb.Interaction(question_id=q, correct=c) for q, c in self.histories[name]] if sent else []
        return pb.PredictRequest(model=self.vocabulary.model, candidates=candidates, history=history,
                                 learner_id="" if sent else name)

    def lookups(self, backend: str) -> dict[str, float]:
        """The gateways' learner lookups by result, and their step batching (step calls, backend calls)."""
        gateways = self.gateways[backend]
        return {**{r: sum(g.metric("routerkt_state_lookups_total", key="learner", result=r) for g in gateways)
                   for r in LOOKUPS},
                **{part: sum(g.metric(f"routerkt_step_batch_calls_{part}") for g in gateways) for part in BATCHING}}


def _rng(local: threading.local) -> random.Random:
    """The calling thread's own generator (made on its first call)."""
    if not hasattr(local, "rng"):
        local.rng = random.Random()
    return local.rng


def _phase(targets: Targets, target: str, call, callers: int, seconds: float, merged: dict) -> None:
    """One timed phase of `call` on `target`, added to merged[target]."""
    server = target.split(":")[0]
    print(f"{target}: {callers} callers, {seconds:g}s", file=sys.stderr, flush=True)
    cpu = sum(process_cpu_s(pid) for pid in targets.pids[server])
    latencies, failures, wall = run_phase(call, callers, seconds)
    row = merged.setdefault(target, {"latencies": [], "failures": 0, "seconds": 0.0, "cpu_s": 0.0})
    row["latencies"] += latencies
    row["failures"] += len(failures)
    row["seconds"] += wall
    row["cpu_s"] += sum(process_cpu_s(pid) for pid in targets.pids[server]) - cpu


def _summary(row: dict) -> dict:
    ms, calls = np.asarray(row["latencies"]) * 1e3, max(len(row["latencies"]), 1)
    return {"calls": len(row["latencies"]), "failures": row["failures"], "seconds": round(row["seconds"], 2),
            "calls_per_s": len(row["latencies"]) / max(row["seconds"], 1e-9),
            "p50_ms": float(np.percentile(ms, 50)) if ms.size else None,
            "p99_ms": float(np.percentile(ms, 99)) if ms.size else None,
            "server_cpu_ms_per_call": row["cpu_s"] * 1e3 / calls}


def _predicts(targets: Targets, callers: int) -> dict:
    """Interleaved rounds of the ceiling, by-id and stateless Predicts at `callers` callers."""
    pb, names, questions = targets.pb, list(targets.histories), targets.vocabulary.questions
    merged: dict[str, dict] = {}
    before = {b: targets.lookups(b) for b in targets.backends}
    for _ in range(targets.args.rounds):
        for target in ["ceiling", *(f"{b}:{mode}" for b in targets.backends for mode in ("id", "sent"))]:
            server, mode = (target.split(":") + ["id"])[:2]
            local = threading.local()

            def call(server=server, mode=mode) -> None:
                rng = _rng(local)
                candidates = [pb.Candidate(question_id=rng.choice(questions))]
                targets.clients[server]("Predict", targets.request(rng.choice(names), candidates, mode == "sent"),
                                        60)
            _phase(targets, target, call, callers, targets.args.seconds, merged)
    return _report(targets, merged, before)


def _sessions(targets: Targets, callers: int = 8) -> dict:
    """Predict by learner_id then the Observe of that answer, interleaved rounds, every gateway and the ceiling."""
    pb, names, questions = targets.pb, list(targets.histories), targets.vocabulary.questions
    merged: dict[str, dict] = {}
    before = {b: targets.lookups(b) for b in targets.backends}
    for _ in range(targets.args.rounds):
        for server in ["ceiling", *targets.backends]:
            local = threading.local()

            def call(server=server) -> None:
                rng = _rng(local)
                name, question = rng.choice(names), rng.choice(questions)
                client = targets.clients[server]
                client("Predict", pb.PredictRequest(model=targets.vocabulary.model, learner_id=name,
                                                    candidates=[pb.Candidate(question_id=question)]), 60)
                client("Observe", pb.ObserveRequest(learner_id=name, events=[pb.Event(
                    event_id=f"s-{name}-{next(targets.sent)}", question_id=question, correct=rng.randint(0, 1))]),
                    60)
            _phase(targets, server, call, callers, targets.args.seconds, merged)
    return _report(targets, merged, before)


def _report(targets: Targets, merged: dict, before: dict) -> dict:
    """Each target's summary, and each gateway's lookups since `before`."""
    out = {target: _summary(row) for target, row in merged.items()}
    for b in targets.backends:
        since = {r: v - before[b][r] for r, v in targets.lookups(b).items()}
        out[f"{b}:lookups"] = {r: since[r] for r in LOOKUPS}
        out[f"{b}:batching"] = {part: since[part] for part in BATCHING}
    return out


def _tables(report: dict) -> str:
    lines = ["| callers | backend | ceiling calls/s | by id calls/s | by id / ceiling | stateless calls/s | "
             "by id / stateless | by id p50 / p99 ms | gateway CPU ms per call (by id) | hits / lookups | "
             "step calls per backend call |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for callers, row in report["predict"].items():
        ceiling = row["ceiling"]["calls_per_s"]
        for b in report["backends"]:
            by_id, sent, looks = row[f"{b}:id"], row[f"{b}:sent"], row[f"{b}:lookups"]
            batching = row[f"{b}:batching"]
            lines.append(f"| {callers} | {b} | {ceiling:,.0f} | {by_id['calls_per_s']:,.0f} | "
                         f"{by_id['calls_per_s'] / ceiling:.2f} | {sent['calls_per_s']:,.0f} | "
                         f"{by_id['calls_per_s'] / max(sent['calls_per_s'], 1e-9):.2f} | "
                         f"{by_id['p50_ms']:.2f} / {by_id['p99_ms']:.2f} | {by_id['server_cpu_ms_per_call']:.2f} | "
                         f"{looks['hit']:.0f} / {sum(looks.values()):.0f} | {_per_call(batching)} |")
    s = report["sessions"]
    lines += ["", "| session pattern, 8 callers | answers/s | of the ceiling | Predict+Observe p50 / p99 ms | "
              "server CPU ms per answer | lookups hit / appended / miss / stale |", "|---|---|---|---|---|---|"]
    for server in ["ceiling", *report["backends"]]:
        row, looks = s[server], s.get(f"{server}:lookups")
        lookups = "-" if looks is None else " / ".join(f"{looks[r]:.0f}" for r in LOOKUPS)
        lines.append(f"| {server} | {row['calls_per_s']:,.0f} | {row['calls_per_s'] / s['ceiling']['calls_per_s']:.2f} | "
                     f"{row['p50_ms']:.2f} / {row['p99_ms']:.2f} | {row['server_cpu_ms_per_call']:.2f} | {lookups} |")
    return "\n".join(lines) + "\n"


def _per_call(batching: dict) -> str:
    """Mean step calls per backend step call ("-": none, step batching off or no step call)."""
    return f"{batching['sum'] / batching['count']:.2f}" if batching["count"] else "-"


def run(args: argparse.Namespace) -> int:
    callers = [int(c) for c in args.callers.split(",") if c]
    if (not callers or min(callers) < 1 or args.learners < 1 or args.history < 0 or args.rounds < 1
            or args.gateways < 1):
        raise UserError("--callers, --learners, --rounds, --gateways must be >= 1 and --history >= 0")
    args.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        stop_children_on_sigterm(stack)
        targets = Targets(args, stack)
        gap = targets.store()
        report = {"backends": targets.backends, "gateways": args.gateways, "history": args.history, "learners": args.learners,
                  "seconds": args.seconds, "rounds": args.rounds, "max_abs_diff": gap,
                  "predict": {str(c): _predicts(targets, c) for c in callers}, "sessions": _sessions(targets)}
    atomic_write_json(args.out / "ceiling.json", report)
    print(f"max |P by learner_id - P with the history sent| = {gap:.2e}")
    print(_tables(report), end="")
    return 0
