"""serving/cli/demo.py: the printed sample request drops unset repeated fields but keeps zeros."""
import pytest

from serving.api import knowledge_tracing_pb2 as pb
from serving.cli.demo import without_empty

pytestmark = pytest.mark.unit


def test_sample_request_body_has_no_empty_lists():
    from google.protobuf import json_format

    request = pb.PredictRequest(model="m", history=[pb.Interaction(question_id=3, skill_id=0, correct=0)],
                                candidates=[pb.Candidate(question_id=4, skill_ids=[5, 6])])
    body = json_format.MessageToDict(request, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    assert body["history"][0]["skill_ids"] == []
    pruned = without_empty(body)
    assert "skill_ids" not in pruned["history"][0] and pruned["history"][0]["correct"] == 0
    assert pruned["history"][0]["skill_id"] == "0" and pruned["candidates"][0]["skill_ids"] == ["5", "6"]
