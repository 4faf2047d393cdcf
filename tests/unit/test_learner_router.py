"""LearnerRouter's ring: a learner has one owner, the learners spread over the gateways, and adding a gateway moves
only the learners it takes (about 1/n of them), none between the old gateways."""
from __future__ import annotations

import pytest

from serving.client import LearnerRouter

pytestmark = pytest.mark.unit

LEARNERS = [f"learner-{k}" for k in range(3000)]


def test_each_learner_has_one_owner_and_the_learners_spread() -> None:
    with LearnerRouter(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]) as router:
        owners = [router.owner(learner) for learner in LEARNERS]
        assert owners == [router.owner(learner) for learner in LEARNERS]            # stable
        shares = [owners.count(a) / len(LEARNERS) for a in router.addresses]
        assert min(shares) > 0.2 and max(shares) < 0.47, shares
        assert sorted(router.owners(LEARNERS[0])) == [0, 1, 2]                    # every gateway, owner first


def test_adding_a_gateway_moves_only_the_learners_it_takes() -> None:
    with LearnerRouter(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]) as three, \
            LearnerRouter(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]) as four:
        moved = [(three.owner(l), four.owner(l)) for l in LEARNERS if three.owner(l) != four.owner(l)]
        assert all(new == "127.0.0.1:4" for _, new in moved)
        assert 0.12 < len(moved) / len(LEARNERS) < 0.4, len(moved)


def test_no_address_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        LearnerRouter([" ", ""])


def test_the_client_sends_a_route_header_on_calls_naming_one_learner() -> None:
    """serving.client.connect's interceptor: a call naming a learner carries route_key(id) (a digest, never the id;
    the learner router hashes it), a call naming none carries no route header; the API key rides along."""
    from types import SimpleNamespace

    from serving.api import knowledge_tracing_pb2 as pb
    from serving.client import ROUTE_HEADER, _Access, route_key

    def sent(request) -> dict[str, str]:
        seen = {}
        details = SimpleNamespace(method="/routerkt.v1.KnowledgeTracingService/Predict", timeout=1.0, metadata=None,
                                  credentials=None, wait_for_ready=None, compression=None)
        _Access("key-1").intercept_unary_unary(lambda d, r: seen.update(d.metadata), details, request)
        return seen

    named = sent(pb.PredictRequest(learner_id="learner-17"))
    assert named[ROUTE_HEADER] == route_key("learner-17") and named["authorization"] == "Bearer key-1"
    assert "learner-17" not in named[ROUTE_HEADER] and len(named[ROUTE_HEADER]) == 16
    assert route_key("learner-17") != route_key("learner-18")
    assert ROUTE_HEADER not in sent(pb.PredictRequest()) and ROUTE_HEADER not in sent(pb.PredictBatchRequest())
