"""`routerkt retrain` (loop/cli_retrain.py), one concept per file.

- run.py       the stages: policy and canary rule, export, split, evaluate, train, gate, publish
- base_version.py  the base: the version the new model must beat, trained from and whose vocabulary it grows
- report.py    the report: its table, report.json and report.txt
- serving_calls.py  its calls into serving's API: the store's export, the rollout policy (gateway or file), /readyz
- data.py      the forward-in-time split and the grown vocabulary
- train.py     the training step (the base run's configuration, warm or from scratch)
- warm.py      the warm start: the base version's checkpoint mapped onto the grown vocabulary
- score.py     scoring a version or a model on the held-out events
- lock.py      one retrain at a time per repository
- private.py   the learner-data folder (0700, swept after a killed run)
"""
