"""The committed generated gRPC code matches what serving/api/codegen.py produces from the .proto."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the code")


def test_generated_code_has_not_drifted(tmp_path: Path) -> None:
    from serving.api import codegen
    written = codegen.generate(tmp_path)
    committed = codegen.generated_files()
    assert [p.name for p in written] == [p.name for p in committed]
    for fresh, current in zip(written, committed):
        assert current.is_file(), f"{current} is missing: run `python -m serving.api.codegen`"
        assert fresh.read_text() == current.read_text(), (
            f"{current.name} differs from the .proto: run `python -m serving.api.codegen` and commit the result")


def test_generated_code_imports_without_path_tricks() -> None:
    from serving.api import knowledge_tracing_pb2 as pb
    from serving.api import knowledge_tracing_pb2_grpc as pb_grpc
    service = pb.DESCRIPTOR.services_by_name["KnowledgeTracingService"]
    assert service.full_name == "routerkt.v1.KnowledgeTracingService"
    assert {m.name for m in service.methods} == {"Predict", "PredictBatch", "Recommend", "Observe", "ForgetLearner",
                                                      "ReportOutcome", "Mastery"}
    assert hasattr(pb_grpc, "KnowledgeTracingServiceStub")
    text = Path(pb_grpc.__file__).read_text()
    assert "from serving.api import knowledge_tracing_pb2" in text


def test_optional_skill_ids_have_presence() -> None:
    from serving.api import knowledge_tracing_pb2 as pb
    assert not pb.Candidate(question_id=1).HasField("skill_id")
    assert pb.Candidate(question_id=1, skill_id=0).HasField("skill_id")
    assert not pb.Interaction(question_id=1, correct=1).HasField("skill_id")
