"""The benchmarks of `routerkt bench <name>`, one module per name (routerkt/cli.py's BENCHES table).

    throughput  inference throughput: PyTorch vs onnxruntime vs Triton
    load        locust load test against the gateway (--sessions: the session phases)
    ranking     history-once ranking vs one window per candidate (--mastery: the rank path's calls)
    fairness    small calls alone and beside maximal PredictBatch calls
    chaos       load, a maximal batch, a Triton kill, a version publish and a SIGTERM in one run
    outcomes    Predict / Observe latency with outcome tracking on and off
    convert     the gateway's per-call conversions and their alternatives
    cost        one Predict's cost: in-process onnxruntime vs Triton vs gateway, Triton settings swept
    replicas    one gateway over 1 vs 2 Triton replicas
    security    Predict with TLS and API keys vs plain
    retrain     `routerkt retrain`'s stages per store size and kind
    loop        a dataset replayed day by day through the gateway with a nightly retrain
    incremental Predict by learner_id: the learner-state cache on vs off vs the history in the request
    ceiling     Predict by learner_id on a cache hit vs a do-nothing server of the same service (null_server.py)

A benchmark imports no other benchmark (import-linter checks it); what they share lives beside them
in loadtest/: harness.py (Triton and gateways, the common flags), learners.py, locustfile.py,
locust_runner.py, load_sessions.py, closed_loop.py, null_server.py, timing.py, rank_costs.py, replay_days.py and
loop_report.py. The training benchmarks are training/bench/bench_train.py and training/bench/bench_distributed.py.
"""
