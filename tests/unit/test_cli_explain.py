"""`routerkt predict --explain K`: the flag reaches Predict and Recommend, bad values are one-line
errors with exit 2, and explanations print as text lines and as JSON (real response messages, no server)."""
from __future__ import annotations

import argparse
import json

import pytest

from routerkt.cli import main
from serving.api import knowledge_tracing_pb2 as pb
from serving.cli.cli_predict import add_arguments, build_request, print_response

pytestmark = pytest.mark.unit


def parsed(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)                                    # the real `routerkt predict` flags
    return parser.parse_args(["--target", "h:1", "--model", "kt", "--history", "87:3;9:1,40::0",
                              "--candidates", "5,6", *extra])


def test_explain_reaches_predict_and_recommend() -> None:
    predict = build_request(parsed("--explain", "3"))
    assert isinstance(predict, pb.PredictRequest) and predict.explain.top_k == 3
    recommend = build_request(parsed("--explain", "2", "--recommend", "--top-k", "1"))
    assert isinstance(recommend, pb.RecommendRequest) and recommend.explain.top_k == 2 and recommend.top_k == 1
    assert not build_request(parsed()).HasField("explain")
    assert not build_request(parsed("--recommend")).HasField("explain")


@pytest.mark.parametrize("extra", [
    ["--candidates", "1", "--explain", "0"],
    ["--candidates", "1", "--explain", "-3"],
    ["--candidates", "1", "--explain", "x"],
    ["--candidates", "1", "--explain"],
    ["--mastery", "--explain", "2"],
])
def test_bad_explain_flags_exit_2_with_one_line(extra: list[str], capsys: pytest.CaptureFixture) -> None:
    try:
        code = main(["predict", "--target", "h:1", "--model", "kt", *extra])
    except SystemExit as exc:                                # argparse errors
        code = int(exc.code)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--explain" in err, err


EXPLANATION = pb.CandidateExplanation(head_weights=[1.0, 0.25], attended=[
    pb.AttendedInteraction(position=4, question_id=87, skill_ids=[3, 9], correct=True, weight=0.5,
                           head_attention=[0.5, 0.5]),
    pb.AttendedInteraction(position=1, question_id=40, correct=False, weight=0.125, head_attention=[0.25, 0.0])])
EXPLANATION_JSON = {"head_weights": [1.0, 0.25], "attended": [
    {"position": 4, "question_id": 87, "skill_ids": [3, 9], "correct": True, "weight": 0.5,
     "head_attention": [0.5, 0.5]},
    {"position": 1, "question_id": 40, "skill_ids": [], "correct": False, "weight": 0.125,
     "head_attention": [0.25, 0.0]}]}
EXPLANATION_LINES = ["  head weights: 1.000 0.250",
                     "  attended position 4\tquestion 87\tskills 3;9\tcorrect 1\tweight 0.5000",
                     "  attended position 1\tquestion 40\tskills -\tcorrect 0\tweight 0.1250"]


def printed(capsys: pytest.CaptureFixture, args: argparse.Namespace, response) -> str:
    print_response(args, build_request(args), response)
    return capsys.readouterr().out


def test_predict_prints_each_candidates_explanation(capsys: pytest.CaptureFixture) -> None:
    response = pb.PredictResponse(model="kt", version=1, history_used=2, probabilities=[0.75, 0.5],
                                  explanations=[EXPLANATION, pb.CandidateExplanation(head_weights=[1.0, 0.0])])
    assert printed(capsys, parsed("--explain", "2"), response).splitlines() == [
        "model kt version 1 (history used: 2)", "question 5\tP(correct) = 0.750000", *EXPLANATION_LINES,
        "question 6\tP(correct) = 0.500000", "  head weights: 1.000 0.000"]
    answer = json.loads(printed(capsys, parsed("--explain", "2", "--json"), response))
    assert answer["probabilities"] == [0.75, 0.5] and answer["candidates"] == [5, 6]
    assert answer["explanations"] == [EXPLANATION_JSON, {"head_weights": [1.0, 0.0], "attended": []}]
    plain = pb.PredictResponse(model="kt", version=1, history_used=2, probabilities=[0.75, 0.5])
    assert "explanations" not in json.loads(printed(capsys, parsed("--json"), plain))
    assert "head weights" not in printed(capsys, parsed(), plain)


def test_recommend_prints_each_recommendations_explanation(capsys: pytest.CaptureFixture) -> None:
    response = pb.RecommendResponse(model="kt", version=1, history_used=2, recommendations=[
        pb.Recommendation(question_id=6, probability=0.75, explanation=EXPLANATION)])
    assert printed(capsys, parsed("--recommend", "--explain", "2"), response).splitlines() == [
        "model kt version 1 (history used: 2, excluded as seen: 0)", "1. question 6\tP(correct) = 0.750000",
        *EXPLANATION_LINES]
    answer = json.loads(printed(capsys, parsed("--recommend", "--explain", "2", "--json"), response))
    assert answer["recommendations"] == [{"question_id": 6, "probability": 0.75, "explanation": EXPLANATION_JSON}]
    plain = json.loads(printed(capsys, parsed("--recommend", "--json"), pb.RecommendResponse(
        recommendations=[pb.Recommendation(question_id=6, probability=0.75)])))
    assert plain["recommendations"] == [{"question_id": 6, "probability": 0.75}]
