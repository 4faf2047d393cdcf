"""The serving side: a gRPC gateway (and its HTTP mirror) in front of Triton. Map of the folder:

    cli_serve.py, cli_predict.py   `routerkt serve` / `routerkt predict`; logs.py, demo.py: their set-up and sample
    server.py          GatewayServer: assembles the parts (create_server), runs both transports, health, shutdown
    transport/         gRPC adapter (grpc_api.py) and HTTP mirror (http_api.py): thin, one error mapping each
    prediction.py      PredictionService: the pipeline validate -> history -> version -> encode -> infer -> sinks
    parts.py           the pipeline's interfaces (HistorySource, VersionPolicy, Encoder, InferenceBackend, ...)
    requests.py, validation.py, features.py, admission.py, catalog.py, recommend.py   pipeline pieces
    backends/          InferenceBackend implementations: triton/ (client, supervisor, backend, replicas), onnxruntime.py
    tritonserver/      the tritonserver process: launcher, restarts, watchdog, /proc helpers
    sessions/          learner sessions: store interface and implementations, keys, Observe, history sources
    rollout/           which version answers: policy file, watcher and guardrail, kinds/ (latest, pinned, canary, shadow)
    outcomes/          served predictions joined with answers: online quality per version
    metrics.py, settings.py, errors.py, processes.py   shared: registry, settings, error codes, child processes
    api/               the routerkt.v1 proto and its generated code; dashboards/, deploy/: ops files
"""
