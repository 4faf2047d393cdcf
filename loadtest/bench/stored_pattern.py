"""`routerkt bench incremental --pattern stored|real`: learners who already have a history, each call a Predict
then the Observe of that answer, by learner_id on the cache-on gateway against the same Predicts sent
statelessly (the caller's whole kept history in the request) on the cache-off one; rounds interleaved.

- stored: `--learners` learners per `--histories` length, answering random questions;
- real: learners placed at answer positions drawn uniformly over all the answers of a real dataset
  (`--dataset`, default assist2017), so most sit where they answer most; each replays its own next
  answers (question ids mapped onto the model's vocabulary: the speed, not the accuracy, is measured).
Per pattern and caller count: answers/s and Predict p50 / p99 of both paths, their ratio, the gateway's CPU
per answer, the learner-state lookups (hit / appended / miss / stale) and the fills; then the largest
|P by learner_id - P with the same history sent| over a sample of the learners afterwards.
"""
from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import numpy as np

from loadtest.closed_loop import process_cpu_s, run_phase, summary

ROUNDS = 2                    # the two paths take turns, round by round
PATHS = ("on", "stateless")   # by learner_id (cache on) | history in the request (cache off)


class Learners:
    """Each learner's kept history and upcoming answers, one copy per path (the two stores drift apart)."""

    def __init__(self, histories: dict[str, list], upcoming: dict[str, list]) -> None:
        self.kept = {path: {k: list(v) for k, v in histories.items()} for path in PATHS}
        self.upcoming = upcoming
        self.locks = {k: threading.Lock() for k in histories}
        self.names = list(histories)

    def next_answer(self, path: str, learner: str, rng: random.Random, questions: list) -> tuple:
        """The learner's next (question, correct): its own next answer, else a random one."""
        done = len(self.kept[path][learner])
        queue = self.upcoming.get(learner, [])
        return queue[done] if done < len(queue) else (rng.choice(questions), rng.randint(0, 1))


def stored(bench, length: int) -> Learners:
    """`--learners` learners of `length` random answers, in both stores."""
    histories = {}
    for k in range(bench.args.learners):
        name = f"stored-{length}-{k}"
        histories[name] = [bench.interaction() for _ in range(length)]
        bench.observe(name, histories[name])
    return Learners(histories, {})


def real(bench, path: Path, seed: int) -> tuple[Learners, dict]:
    """`--learners` learners of a real dataset, each cut at an answer position drawn uniformly over all the
    dataset's answers (its history before it stored, the rest to replay); and facts of the draw."""
    from training.data.csv_reader import read_interactions
    inter = read_interactions(path)
    users, starts, lengths = inter.segments()
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, int(lengths.sum()), bench.args.learners)
    owner = np.searchsorted(np.cumsum(lengths), drawn, side="right")
    position = drawn - (np.cumsum(lengths) - lengths)[owner]
    questions = bench.vocabulary.questions
    histories, upcoming = {}, {}
    for k, (o, t) in enumerate(zip(owner, position)):
        rows = range(starts[o], starts[o] + lengths[o])
        answers = [(questions[int(inter.question_id[i]) % len(questions)], int(inter.correct[i])) for i in rows]
        name = f"real-{k}"
        histories[name], upcoming[name] = answers[:t], answers
        if t:
            bench.observe(name, answers[:t])
    facts = {"dataset": path.parent.name if path.name.startswith("interactions") else path.name,
             "positions_p50": float(np.median(position)), "past_window_share": float(np.mean(position >= 99))}
    return Learners(histories, upcoming), facts


def _phase(bench, learners: Learners, path: str, callers: int, seconds: float) -> dict:
    """Closed loop: each call takes a free learner, Predicts its next question (4 candidates, the first its
    next question), then Observes the answer."""
    pb = bench.pb
    stub = bench.stubs["on" if path == "on" else "off"]
    gateway = bench.gateways["on" if path == "on" else "off"]
    predict_s: list[float] = []
    lock = threading.Lock()
    local = threading.local()

    def call() -> None:
        rng = getattr(local, "rng", None) or random.Random()
        local.rng = rng
        while True:
            learner = rng.choice(learners.names)
            if learners.locks[learner].acquire(blocking=False):
                break
        try:
            kept = learners.kept[path][learner]
            question, correct = learners.next_answer(path, learner, rng, bench.vocabulary.questions)
            wanted = [pb.Candidate(question_id=question)] + [
                pb.Candidate(question_id=rng.choice(bench.vocabulary.questions)) for _ in range(3)]
            named = {"learner_id": learner} if path == "on" else {
                "history": [pb.Interaction(question_id=q, correct=c) for q, c in kept]}
            started = time.perf_counter()
            stub.Predict(pb.PredictRequest(model=bench.model, candidates=wanted, **named), timeout=30)
            elapsed = time.perf_counter() - started
            stub.Observe(pb.ObserveRequest(learner_id=learner, events=[pb.Event(
                event_id=f"{learner}-{len(kept)}", question_id=question, correct=correct,
                timestamp_ms=1 + len(kept))]), timeout=30)
            kept.append((question, correct))
            with lock:
                predict_s.append(elapsed)
        finally:
            learners.locks[learner].release()

    before, fills = bench.lookups("learner", gateway="on"), bench.fills("on")
    cpu = process_cpu_s(gateway.process.pid)
    _, failures, wall = run_phase(call, callers, seconds)
    cpu = process_cpu_s(gateway.process.pid) - cpu
    after, fills_after = bench.lookups("learner", gateway="on"), bench.fills("on")
    return {"predict_s": predict_s, "failures": len(failures), "wall_s": wall, "cpu_s": cpu,
            "lookups": {r: after[r] - before[r] for r in after}, "fills": {r: fills_after[r] - fills[r] for r in fills}}


def _row(rounds: list[dict], name: str, callers: int) -> dict:
    out: dict = {"pattern": name, "callers": callers}
    for path in PATHS:
        parts = [r[path] for r in rounds]
        times = [v for p in parts for v in p["predict_s"]]
        wall = sum(p["wall_s"] for p in parts)
        stats = summary(times, [], wall)
        out[path] = {"answers_per_s": stats["calls_per_s"], "predict_p50_ms": stats["p50_ms"],
                     "predict_p99_ms": stats["p99_ms"], "failures": sum(p["failures"] for p in parts),
                     "gateway_cpu_ms_per_answer": sum(p["cpu_s"] for p in parts) * 1e3 / max(len(times), 1)}
    on = [r["on"] for r in rounds]
    out["lookups"] = {k: sum(p["lookups"][k] for p in on) for k in on[0]["lookups"]}
    out["fills"] = {k: sum(p["fills"][k] for p in on) for k in on[0]["fills"]}
    total = sum(out["lookups"].values()) or 1.0
    out["cached_share"] = (out["lookups"]["hit"] + out["lookups"]["appended"]) / total
    out["on_vs_stateless"] = out["on"]["answers_per_s"] / max(out["stateless"]["answers_per_s"], 1e-9)
    return out


def _gap(bench, learners: Learners, sample: int = 16) -> float:
    """max |Predict by learner_id - the same history sent| on the cache-on gateway, over `sample` learners."""
    pb, stub, gap = bench.pb, bench.stubs["on"], 0.0
    for learner in learners.names[:sample]:
        wanted = [pb.Candidate(question_id=q) for q in bench.vocabulary.questions[:3]]
        by_id = stub.Predict(pb.PredictRequest(model=bench.model, learner_id=learner, candidates=wanted), timeout=30)
        sent = stub.Predict(pb.PredictRequest(model=bench.model, candidates=wanted, history=[
            pb.Interaction(question_id=q, correct=c) for q, c in learners.kept["on"][learner]]), timeout=30)
        gap = max(gap, float(np.abs(np.asarray(by_id.probabilities) - np.asarray(sent.probabilities)).max()))
    return gap


def _warm(bench, learners: Learners) -> None:
    """One untimed Predict by learner_id per learner: its state built once, before the timed rounds."""
    pb = bench.pb
    wanted = [pb.Candidate(question_id=bench.vocabulary.questions[0])]
    for learner in learners.names:
        bench.stubs["on"].Predict(pb.PredictRequest(model=bench.model, learner_id=learner, candidates=wanted), timeout=60)


def run_pattern(bench, name: str, learners: Learners, callers_list: list[int], seconds: float) -> list[dict]:
    """The pattern's rows (one per caller count), each path `ROUNDS` times in turn, after one untimed Predict by
    learner_id per learner (the states built: a miss each, not counted in the rows)."""
    _warm(bench, learners)
    rows = []
    for callers in callers_list:
        rounds = [{path: _phase(bench, learners, path, callers, seconds / ROUNDS) for path in PATHS}
                  for _ in range(ROUNDS)]
        row = _row(rounds, name, callers)
        row["max_abs_diff"] = _gap(bench, learners)
        rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    print("| pattern | callers | by id answers/s | stateless answers/s | by id / stateless | Predict p50 / p99 ms by id "
          "| stateless | gateway CPU ms/answer by id / stateless | cached (hit + appended) | lookups | fills "
          "| max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        on, off = r["on"], r["stateless"]
        lookups = {k: int(v) for k, v in r["lookups"].items() if v}
        fills = {k: int(v) for k, v in r["fills"].items() if v}
        print(f"| {r['pattern']} | {r['callers']} | {on['answers_per_s']:.1f} | {off['answers_per_s']:.1f} | "
              f"{r['on_vs_stateless']:.2f} | {on['predict_p50_ms']:.2f} / {on['predict_p99_ms']:.2f} | "
              f"{off['predict_p50_ms']:.2f} / {off['predict_p99_ms']:.2f} | {on['gateway_cpu_ms_per_answer']:.2f} / "
              f"{off['gateway_cpu_ms_per_answer']:.2f} | {r['cached_share']:.3f} | {lookups} | {fills} | "
              f"{r['max_abs_diff']:.1e} |")
