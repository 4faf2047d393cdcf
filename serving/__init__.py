"""The serving side: a gRPC gateway (and its HTTP mirror) in front of Triton. Map of the folder:

    server.py          GatewayServer: assembles the parts (create_server), runs both transports, health, shutdown
    settings.py, status_errors.py, logs.py, processes.py, client.py   settings, error codes, logging, child processes,
                       the Python client's channel
    cli/               `routerkt serve` / `routerkt predict` and the start-up sample (demo.py)
    transport/         gRPC adapter (grpc_api.py) and HTTP mirror (http_api.py assembles http_routes.py,
                       http_middleware.py, http_errors.py): thin, one error site each
    pipeline/          the interfaces (parts.py), admission, PredictionService and its public steps
    queries/           Recommend, Mastery and explanations, composed from the pipeline's steps
    encoder/           the Encoder part: ids -> windows (window.py)
    core/              shared by all: the calls' dataclasses, validation, the model catalog
    backends/          InferenceBackend implementations: triton/ (client, supervisor and its model_control,
                       gates, backend, replicas), onnxruntime.py
    tritonserver/      the tritonserver process: launcher (its command line: command.py; triton_ready.py),
                       restarts, watchdog, /proc helpers
    sessions/          learner sessions: store interface and implementations, keys, Observe, history sources,
                       `routerkt sessions import/export`
    rollout/           which version answers: the policy, its watcher, canaries, guardrail, promotion, kinds/
    outcomes/          served predictions joined with answers: online quality per version
    metrics/           Prometheus metrics declared by concern (__init__.py), gRPC calls counted by their
                       handlers (grpc_calls.py), the prediction sink (sink.py), online quality per version (quality.py)
    state/             the learner-state cache: states per learner, the step path (learner_states.py), fingerprints
    security/          TLS, API keys, scopes, audit, failed-key limits, serve's own keys
    api/               the routerkt.v1 proto, its generated code and codegen.py; dashboards/, deploy/: ops files
"""
