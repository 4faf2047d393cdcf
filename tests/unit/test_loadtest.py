"""The load test's logic without servers: loopback-only targets, the users mix and duration flags,
locust CSV parsing and the SLO / exit-code decision, simulated learners (history growth and cap,
real and unknown ids), the vocabulary lookup, and the interceptor that reports calls to locust
(fake continuations, no network). The locustfile itself is never imported here: importing locust
monkey-patches the test process with gevent."""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from loadtest import locust_runner
from loadtest.bench import load
from loadtest.learners import (DEFAULT_WEIGHTS, GrpcCallError, Learner, LearnerOptions, NotLoopbackError,
                               RequestEventInterceptor, Vocabulary, load_vocabulary, loopback_target,
                               parse_user_mix, resolve_model)
from routerkt.errors import UserError
from serving.api import knowledge_tracing_pb2 as pb

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HEADER = ("Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,Min Response Time,"
          "Max Response Time,Average Content Size,Requests/s,Failures/s,50%,66%,75%,80%,90%,95%,98%,99%,99.9%,"
          "99.99%,100%")


# -- target --------------------------------------------------------------------------------------
@pytest.mark.parametrize("host, target", [
    ("127.0.0.1:50051", "127.0.0.1:50051"), ("127.8.9.10:1", "127.8.9.10:1"), ("localhost:8001", "localhost:8001"),
    ("LOCALHOST:8001", "LOCALHOST:8001"), ("[::1]:50051", "[::1]:50051"), (" 127.0.0.1:5 ", "127.0.0.1:5")])
def test_loopback_targets_are_accepted(host: str, target: str) -> None:
    assert loopback_target(host) == target


@pytest.mark.parametrize("host", ["10.0.0.1:50051", "0.0.0.0:50051", "192.168.1.5:80", "128.0.0.1:80",
                                  "example.com:50051", "[::]:50051", "[2001:db8::1]:50051"])
def test_other_targets_are_refused(host: str) -> None:
    with pytest.raises(NotLoopbackError, match="only loopback targets are allowed"):
        loopback_target(host)


@pytest.mark.parametrize("host, message", [
    ("http://127.0.0.1:50051", "without a scheme"), ("127.0.0.1", "HOST:PORT"), ("127.0.0.1:0", "port"),
    ("127.0.0.1:70000", "port"), ("127.0.0.1:abc", "port"), ("[::1]50051", r"\[IPV6\]:PORT"), ("", "no target"),
    (None, "no target")])
def test_malformed_targets_get_a_specific_error(host, message: str) -> None:
    with pytest.raises(UserError, match=message) as info:
        loopback_target(host)
    assert not isinstance(info.value, NotLoopbackError)


def test_the_locustfile_refuses_a_remote_host_before_any_user_starts(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "locust", "-f", str(locust_runner.LOCUSTFILE), "--headless", "-u", "1",
                          "-t", "2s", "--host", "10.1.2.3:50051", "--repository", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "only loopback targets are allowed" in out.stderr
    assert "Ramping to" not in out.stderr


# -- flags ---------------------------------------------------------------------------------------
def test_user_mix() -> None:
    assert parse_user_mix("LearnerUser,BatchUser") == DEFAULT_WEIGHTS
    assert parse_user_mix("BatchUser:5") == {"BatchUser": 5}
    assert parse_user_mix(" LearnerUser:2 , BatchUser:1 ") == {"LearnerUser": 2, "BatchUser": 1}
    for text, message in (("Foo", "unknown user class 'Foo'"), ("LearnerUser:0", "integer >= 1"),
                          ("LearnerUser:x", "integer >= 1"), ("LearnerUser,LearnerUser", "named twice"), ("", "at least")):
        with pytest.raises(UserError, match=message):
            parse_user_mix(text)


def test_duration() -> None:
    assert [load.parse_duration(t) for t in ("90", "45s", "2m", "1m30s", "1h", "1H2M3S")] == [90, 45, 120, 90, 3600, 3723]
    for text in ("", "0", "0s", "5x", "m", "1.5m", "-3"):
        with pytest.raises(UserError, match="--duration"):
            load.parse_duration(text)


# -- locust CSVs and the decision ----------------------------------------------------------------
def write_stats(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def test_read_stats(tmp_path: Path) -> None:
    path = write_stats(tmp_path / "locust_stats.csv", [
        "grpc,Predict,400,2,6,8.1,2.9,37.5,20.2,57.9,0.3,6,7,9,10,16,21,28,32,38,38,38",
        "grpc,PredictBatch,0,0,0,0,0,0,0,0,0,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A",
        ",Aggregated,400,2,6,8.1,2.9,37.5,20.2,57.9,0.3,6,7,9,10,16,21,28,32,38,38,38"])
    rpcs, total = locust_runner.read_stats(path)
    assert set(rpcs) == {"Predict", "PredictBatch"}
    assert rpcs["Predict"] == locust_runner.RpcStats(400, 2, 57.9, 6.0, 21.0, 32.0, 37.5)
    assert rpcs["PredictBatch"].p99_ms is None and rpcs["PredictBatch"].requests == 0
    assert total.requests == 400 and total.failures == 2
    with pytest.raises(UserError, match="wrote no stats"):
        locust_runner.read_stats(tmp_path / "missing.csv")
    with pytest.raises(UserError, match="no 'Aggregated' row"):
        locust_runner.read_stats(write_stats(tmp_path / "b.csv", ["grpc,Predict,1,0,6,8,2,3,2,5,0,6,7,9,10,16,21,28,32,38,38,38"]))
    with pytest.raises(UserError, match="unexpected locust CSV"):
        locust_runner.read_stats(write_stats(tmp_path / "c.csv", [",Aggregated,many,0,6,8,2,3,2,5,0,6,7,9,10,16,21,28,32,38,38,38"]))
    assert "Predict" in load.format_table(rpcs, total) and "N/A" not in load.format_table(rpcs, total)


def stats(requests: int, failures: int, p99: float | None) -> locust_runner.RpcStats:
    return locust_runner.RpcStats(requests, failures, 10.0, p99, p99, p99, p99)


def test_slo_decision() -> None:
    slo = load.Slo(max_failure_ratio=0.01, max_p99_ms=500)
    expected = ["Predict", "PredictBatch"]
    ok = {"Predict": stats(900, 5, 40.0), "PredictBatch": stats(100, 0, 90.0)}
    assert load.check_slos(ok, stats(1000, 5, 90.0), slo, expected) == []           # 0.5 % failed: within
    assert load.check_slos(ok, stats(1000, 10, 90.0), slo, expected) == []          # exactly at the limit
    [ratio] = load.check_slos(ok, stats(1000, 11, 90.0), slo, expected)
    assert ratio.startswith("failure ratio 0.0110 > 0.01") and "11 of 1000" in ratio
    slow = {**ok, "PredictBatch": stats(100, 0, 620.0)}
    assert load.check_slos(slow, stats(1000, 0, 620.0), slo, expected) == ["PredictBatch p99 620 ms > 500 ms"]
    missing = {"Predict": ok["Predict"]}
    [none] = load.check_slos(missing, stats(900, 0, 40.0), slo, expected)
    assert none.startswith("no PredictBatch requests were made")
    assert load.check_slos(missing, stats(900, 0, 40.0), slo, ["Predict"]) == []
    assert load.check_slos({}, stats(0, 0, None), slo, expected) == ["no requests were made"]


def test_locust_exit_codes() -> None:
    assert load.locust_problems(0, False, 0) == []
    assert load.locust_problems(locust_runner.LOCUST_FAILURES_EXIT, False, 0) == []        # failed requests: SLOs decide
    assert load.locust_problems(1, False, 0) == ["locust exited with code 1 (see locust.log)"]
    assert load.locust_problems(None, True, 0)[0].startswith("locust ran past --duration")
    assert load.locust_problems(locust_runner.LOCUST_FAILURES_EXIT, False, 2) == [
        "the locustfile raised 2 exception(s) (see locust_exceptions.csv)"]


def test_locust_command_keeps_failed_requests_apart_from_broken_runs(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    args = parser.parse_args(["--users", "3", "--duration", "2m", "--user-classes", "LearnerUser:2,BatchUser:1"])
    duration, mix, rate = load.validate(args)
    assert (duration, mix, rate) == (120, {"LearnerUser": 2, "BatchUser": 1}, 3.0)
    command = locust_runner.locust_command(args, "127.0.0.1:5", "kt", mix, duration, rate, tmp_path)
    assert command[command.index("--exit-code-on-error") + 1] == str(locust_runner.LOCUST_FAILURES_EXIT)
    assert command[command.index("-t") + 1] == "120s" and command[-2:] == ["LearnerUser", "BatchUser"]
    for flags, message in ((["--users", "1"], "fewer than"), (["--target", "10.0.0.1:1"], "loopback"),
                           (["--max-failure-ratio", "2"], "failure-ratio"), (["--spawn-rate", "0"], "spawn-rate")):
        with pytest.raises(UserError, match=message):
            load.validate(parser.parse_args(flags))


# -- vocabulary ----------------------------------------------------------------------------------
def make_repository(root: Path, models: dict[str, list[int]]) -> Path:
    from routerkt.contract.vocab import Vocab
    for name, versions in models.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n')
        for version in versions:
            questions = {q: i + 2 for i, q in enumerate(range(100, 100 + 10 * version))}
            Vocab(questions=questions, skills={7: 2}, question_skill={q: 7 for q in questions}).save(
                root / name / str(version) / "vocab.json")
    return root


def test_vocabulary_of_the_latest_version(tmp_path: Path) -> None:
    repo = make_repository(tmp_path / "repo", {"kt": [1, 3]})
    vocab = load_vocabulary(repo, None)
    assert (vocab.model, vocab.version, len(vocab.questions)) == ("kt", 3, 30)
    assert vocab.first_unknown == 130 and vocab.question_skills[100] == (7,)
    assert resolve_model(repo, "kt") == ("kt", 3)


def test_vocabulary_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a folder"):
        load_vocabulary(tmp_path / "nope", None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no models in"):
        load_vocabulary(tmp_path / "empty", None)
    repo = make_repository(tmp_path / "two", {"a": [1], "b": [2]})
    with pytest.raises(UserError, match=r"several models \(a, b\)"):
        load_vocabulary(repo, None)
    with pytest.raises(UserError, match=r"no model 'c'"):
        load_vocabulary(repo, "c")
    (repo / "a" / "1" / "vocab.json").write_text("{broken")
    with pytest.raises(UserError, match="invalid JSON"):
        load_vocabulary(repo, "a")


# -- learners ------------------------------------------------------------------------------------
VOCAB = Vocabulary("kt", 1, tuple(range(10, 30)), {q: (q % 3,) for q in range(10, 30)} | {28: (4, 5), 29: (-1,)})


def learner(seed: int = 0, **options) -> Learner:
    return Learner(VOCAB, LearnerOptions(**options), random.Random(seed))


def test_history_grows_and_is_capped() -> None:
    one = learner(max_history=5, max_candidates=3)
    answered = []
    for step in range(12):
        candidates = one.pick_candidates()
        answered.append(one.answer(candidates, [0.5] * len(candidates)))
        assert len(one.history) == min(step + 1, 5)
    assert one.answered == 12
    assert [i.question_id for i in one.history] == [i.question_id for i in answered[-5:]]   # newest kept, in order
    request = one.predict_request([pb.Candidate(question_id=11)])
    assert request.model == "kt" and len(request.history) == 5 and len(request.candidates) == 1
    assert len(one.learner_request([pb.Candidate(question_id=11)]).history) == 5
    none = learner(max_history=0)
    none.answer([pb.Candidate(question_id=10)], [0.3])
    assert len(none.history) == 0 and none.answered == 1


def test_candidates_use_real_ids_unless_unknown_on_purpose() -> None:
    one = learner(seed=1, max_candidates=4, unknown_share=0.0)
    sizes = set()
    for _ in range(200):
        picked = [c.question_id for c in one.pick_candidates()]
        sizes.add(len(picked))
        assert len(set(picked)) == len(picked) and set(picked) <= set(VOCAB.questions)
        assert not any(c.HasField("skill_id") for c in one.pick_candidates())
    assert sizes == {1, 2, 3, 4}
    unknown = learner(seed=2, unknown_share=1.0)
    assert all(c.question_id >= VOCAB.first_unknown for _ in range(50) for c in unknown.pick_candidates())


def test_answers_follow_the_probability_and_carry_the_skill() -> None:
    one = learner(seed=3)
    assert one.answer([pb.Candidate(question_id=12)], [1.0]).correct == 1
    assert one.answer([pb.Candidate(question_id=12)], [0.0]).correct == 0
    answer = one.answer([pb.Candidate(question_id=13)], [0.5])
    assert answer.HasField("skill_id") and answer.skill_id == 13 % 3
    assert one.answer([pb.Candidate(question_id=29)], [0.5]).skill_id == -1
    assert one.answer([pb.Candidate(question_id=10**9)], [0.5]).skill_id == -1          # unknown question
    several = one.answer([pb.Candidate(question_id=28)], [0.5])                          # a skill set
    assert list(several.skill_ids) == [4, 5] and not several.HasField("skill_id")
    assert list(one.observe_request(several).events[0].skill_ids) == [4, 5]
    rate = sum(one.answer([pb.Candidate(question_id=14)], [0.8]).correct for _ in range(2000)) / 2000
    assert 0.75 < rate < 0.85
    with pytest.raises(ValueError, match="2 probabilities for 1 candidates"):
        one.answer([pb.Candidate(question_id=12)], [0.5, 0.5])
    for bad in (dict(max_candidates=0), dict(max_history=-1), dict(unknown_share=1.5)):
        with pytest.raises(UserError):
            LearnerOptions(**bad)


# -- the interceptor -----------------------------------------------------------------------------
class Events:
    def __init__(self) -> None:
        self.fired: list[dict] = []

    def fire(self, **kwargs) -> None:
        self.fired.append(kwargs)


class Details:
    def __init__(self, method: str) -> None:
        self.method = method


class Outcome:
    """What a continuation returns: result() gives the response or raises the RpcError."""

    def __init__(self, response=None, error: Exception | None = None) -> None:
        self.response, self.error = response, error

    def result(self):
        if self.error is not None:
            raise self.error
        return self.response


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def clock(*times: float):
    values = iter(times)
    return lambda: next(values)


def test_interceptor_reports_a_successful_call() -> None:
    events = Events()
    response = pb.PredictResponse(probabilities=[0.25, 0.5], model="kt", version=1, history_used=3)
    outcome = Outcome(response)
    seen = []
    interceptor = RequestEventInterceptor(events, clock=clock(10.0, 10.0125))
    returned = interceptor.intercept_unary_unary(lambda d, r: seen.append((d, r)) or outcome,
                                                 Details("/routerkt.v1.KnowledgeTracingService/Predict"), "req")
    assert returned is outcome and seen[0][1] == "req"
    [event] = events.fired
    assert event["request_type"] == "grpc" and event["name"] == "Predict"
    assert event["response_time"] == pytest.approx(12.5) and event["exception"] is None
    assert event["response_length"] == response.ByteSize() > 0


def test_interceptor_reports_the_status_code_of_a_failed_call() -> None:
    events = Events()
    outcome = Outcome(error=FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Triton is not ready"))
    interceptor = RequestEventInterceptor(events, clock=clock(1.0, 1.5))
    returned = interceptor.intercept_unary_unary(lambda d, r: outcome,
                                                 Details("/routerkt.v1.KnowledgeTracingService/PredictBatch"), None)
    assert returned is outcome                                  # the caller still gets its RpcError
    [event] = events.fired
    assert event["name"] == "PredictBatch" and event["response_time"] == pytest.approx(500.0)
    error = event["exception"]
    assert isinstance(error, GrpcCallError) and error.code is grpc.StatusCode.UNAVAILABLE
    assert str(error) == "UNAVAILABLE: Triton is not ready" and "UNAVAILABLE" in repr(error)
    assert event["response_length"] == 0
    empty = Outcome(error=FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, ""))
    interceptor.clock = clock(0.0, 0.1)
    interceptor.intercept_unary_unary(lambda d, r: empty, Details("/x.Y/Predict"), None)
    assert str(events.fired[-1]["exception"]) == "DEADLINE_EXCEEDED: (no details)"


def test_interceptor_reports_and_reraises_a_broken_continuation() -> None:
    events = Events()

    def broken(details, request):
        raise ValueError("cannot serialize")
    with pytest.raises(ValueError, match="cannot serialize"):
        RequestEventInterceptor(events, clock=clock(0.0, 0.001)).intercept_unary_unary(broken, Details("/a.B/Predict"), 1)
    [event] = events.fired
    assert str(event["exception"]) == "UNKNOWN: ValueError: cannot serialize"


def test_load_json_is_written_atomically(tmp_path: Path) -> None:
    load.write_json(tmp_path / "load.json", {"a": 1})
    assert json.loads((tmp_path / "load.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["load.json"]


def test_bench_load_does_not_import_locust_or_torch() -> None:
    code = ("import sys, loadtest.bench.load, loadtest.learners; "
            "print(sorted(m for m in ('locust', 'gevent', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_throughput_tables_put_fused_beside_plain_and_samples_against_the_peak():
    from loadtest.bench.throughput import peak_lines, table
    results = {"onnxruntime": {"akt-standard": 200.0, "akt": 100.0},
               "onnxruntime-fused": {"akt-standard": 250.0, "akt": 100.0}}
    levels, presets = ["onnxruntime", "onnxruntime-fused"], ["akt-standard", "akt"]
    lines = table(results, presets, levels)
    assert "fused / plain graph (onnxruntime in-process): akt-standard 1.25x, akt 1.00x" in lines
    peak = peak_lines(results, presets, levels, {"akt-standard": 80e6, "akt": 190e6}, peak=100.0)
    row = next(line for line in peak if line.startswith("| akt-standard |"))
    assert row == "| akt-standard | 80.0 | 16.0 (16%) | 20.0 (20%) |"


def test_flops_per_sample_counts_the_models_matmuls():
    import torch
    from export.bench_inputs import N_QUESTIONS, N_SKILLS, make_batch
    from loadtest.bench.throughput import flops_per_sample
    from training.models.registry import build_model, preset_config, with_vocab
    cfg = with_vocab(preset_config("akt-standard"), N_QUESTIONS, N_SKILLS)
    cfg.max_len = 20
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    short, long = flops_per_sample(model, make_batch(4, 10)), flops_per_sample(model, make_batch(4, 20))
    assert short > 0 and 1.9 < long / short < 2.6          # linear layers x2, attention x4 with the length


def test_bench_convert_converts_both_forms_to_the_same_arrays_and_prints_both(capsys) -> None:
    import argparse

    from loadtest.bench import convert
    from serving.transport.grpc_api import batch_query
    messages, columns = convert.requests(7, 3, 2, batch=True)
    assert len(messages.learners[0].history) == 7 and len(columns.learners[0].history_columns.question_ids) == 7
    for a, b in zip(batch_query(messages).learners, batch_query(columns).learners):
        assert a.history_questions.tolist() == b.history_questions.tolist()
        assert a.history_correct.tolist() == b.history_correct.tolist()
        assert a.history_skills.tolist() == b.history_skills.tolist()
    assert convert.run(argparse.Namespace(repeats=1)) == 0
    captured = capsys.readouterr().out
    rows = [line for line in captured.splitlines() if line.startswith("| P")]
    assert len(rows) == 2 and all(row.count("x |") == 1 for row in rows)
    assert "| 1 row, history 99, 1 candidate (identical bytes) |" in captured
