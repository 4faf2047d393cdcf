"""THE scope table: every gRPC method and HTTP route of the gateway and the scope a key needs for it.

A method or route missing here needs `admin` at run time (fail closed), and
tests/integration/test_security_scopes.py fails until it is listed.
"""
from __future__ import annotations

PREDICT = "predict"      # Predict, PredictBatch, Recommend, Mastery (also by learner_id, reading the store)
OBSERVE = "observe"      # Observe, ReportOutcome: writes answers into the store
ADMIN = "admin"          # ForgetLearner, rollout changes (and any future retraining hook)
PUBLIC = "public"        # no key needed: health, metrics, the API's own description
SCOPES = (PREDICT, OBSERVE, ADMIN)

SERVICE = "routerkt.v1.KnowledgeTracingService"
GRPC: dict[str, str] = {
    f"/{SERVICE}/Predict": PREDICT,
    f"/{SERVICE}/PredictBatch": PREDICT,
    f"/{SERVICE}/Recommend": PREDICT,
    f"/{SERVICE}/Mastery": PREDICT,
    f"/{SERVICE}/Observe": OBSERVE,
    f"/{SERVICE}/ReportOutcome": OBSERVE,
    f"/{SERVICE}/ForgetLearner": ADMIN,
}
# services registered beside KnowledgeTracingService, never behind a key (probes, grpcurl)
GRPC_PUBLIC_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")

HTTP: dict[tuple[str, str], str] = {
    ("GET", "/livez"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/metrics"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    ("POST", "/v1/predict"): PREDICT,
    ("POST", "/v1/predict_batch"): PREDICT,
    ("POST", "/v1/recommend"): PREDICT,
    ("POST", "/v1/mastery"): PREDICT,
    ("POST", "/v1/report_outcome"): OBSERVE,
    ("GET", "/v1/rollout"): ADMIN,
    ("PUT", "/v1/rollout/{model}"): ADMIN,
}


def grpc_scope(method: str) -> str:
    """The scope of a gRPC method ("/package.Service/Method"); unknown: admin."""
    return GRPC.get(method, ADMIN)


def http_scope(method: str, path: str) -> str:
    """The scope of an HTTP route (method, route template); HEAD is GET; unknown: admin."""
    return HTTP.get(("GET" if method == "HEAD" else method, path), ADMIN)
