"""`RolloutPolicy`: the pipeline's VersionPolicy driven by the rollout policy file
(serving/rollout/policy_file.py), assembled from small parts:

- watcher.py    the file, checked every settings.rollout_poll_s; a change that does not parse, or that
                names a version the repository lacks, is refused (the last good policy stays, the reason
                is logged, routerkt_rollout_policy_ok drops to 0, routerkt_rollout_policy_errors_total
                counts it; a missing version is read again every poll);
- canaries.py   each canary's outcome totals when it began and its sequential test;
- guardrail.py  each poll: a candidate whose mean log loss exceeds the baseline's by more than the margin
                is pinned back (routerkt_rollout_rollbacks_total);
- promotion.py  then each canary's sequential test: a decision pins the candidate (better) or the
                baseline (worse) (routerkt_rollout_decisions_total, routerkt_rollout_log_loss_difference);
- readiness.py  `change()` (PUT /v1/rollout/{model}) refuses a version the repository lacks or that does
                not load; `routing`: what the gateway actually routes (routerkt_rollout_weight);
- status.py     /v1/rollout.

Canary stickiness: learner -> LearnerKeys.bucket(learner_id, model) in [0, 1); the learner goes to the
candidate when bucket < weight (a keyed hash: unpredictable without the store secret; raising the
weight only moves learners to the candidate). A pin by the guardrail or the test is written back to
the file with a note (a read-only file keeps it in force in this process only, and the log says so).
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

from serving import status_errors as errors
from serving.core.catalog import ModelVersion
from serving.metrics import Metrics
from serving.pipeline.parts import Route
from serving.rollout.canaries import Canaries
from serving.rollout.guardrail import guardrail_verdict
from serving.rollout.kinds.base import Rollout, RouteInputs, requested_version
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy_file import PolicyError, RolloutPolicyFile, parse_model, read_policy, write_policy
from serving.rollout.promotion import read_test
from serving.rollout.readiness import Readiness, require_servable, routing
from serving.rollout.status import policy_status
from serving.rollout.watcher import PolicyWatcher
from serving.sessions.keys import LearnerKeys

log = logging.getLogger("routerkt.gateway.rollout")


class RolloutPolicy:
    """VersionPolicy from a watched policy file (see the module docstring)."""

    def __init__(self, path: Path | None, metrics: Metrics, keys: LearnerKeys | None = None,
                 rng: random.Random | None = None, poll_s: float = 1.0, readiness: Readiness | None = None,
                 load_timeout_s: float = 60.0) -> None:
        self.path = Path(path) if path is not None else None
        self.poll_s = poll_s
        self.readiness = readiness
        self.load_timeout_s = load_timeout_s
        self.metrics = metrics
        self.keys = keys
        self.rng = rng or random.Random()
        self.policy = RolloutPolicyFile()
        self.watcher = PolicyWatcher(self.path, metrics, readiness) if self.path is not None else None
        self.canaries = Canaries(metrics)
        self._decided: dict[str, tuple[Rollout, dict[str, object]]] = {}   # model -> (the pin written, the test)
        self.check_file()

    @property
    def error(self) -> str | None:
        return self.watcher.error if self.watcher is not None else None

    # -- VersionPolicy -----------------------------------------------------------------------------
    def route(self, name: str, requested: int, versions: Mapping[int, ModelVersion], ready: frozenset[int],
              learner_id: str = "") -> Route:
        if requested:
            return Route(requested_version(name, requested, versions, ready))
        return self.policy.get(name).route(RouteInputs(name, versions, ready, lambda: self._bucket(name, learner_id),
                                                       self.rng.random))

    def _bucket(self, name: str, learner_id: str) -> float:
        if learner_id and self.keys is not None:
            return self.keys.bucket(learner_id, name)
        return self.rng.random()

    async def maintain(self) -> None:
        """Watch the file and run the guardrail every `poll_s` until cancelled."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                self.check_file()
                self.check_guardrails()
                self.publish_routing()
            except Exception:                                  # never let the loop die
                log.exception("rollout policy upkeep failed")

    async def close(self) -> None:
        """Nothing to release: the file is read, never held open."""

    def check_file(self) -> bool:
        """Reload the file when it changed; True when a new policy came into force."""
        policy = self.watcher.poll() if self.watcher is not None else None
        if policy is None or policy == self.policy:
            return False
        self.apply(policy)
        log.info("rollout policy in force: %s", policy.to_json()["models"] or "latest for every model")
        return True

    async def change(self, model: str, value: object) -> dict[str, object]:
        """Set one model's entry (PUT /v1/rollout/{model}): validated like the file, every version it names
        held by the repository and answering (asked to load first), then written and in force at once."""
        if self.path is None:
            raise errors.failed_precondition("this gateway runs without a rollout policy file")
        try:
            rollout = parse_model(model, value)
            current = await asyncio.to_thread(read_policy, self.path)
        except PolicyError as exc:
            raise errors.invalid_argument("body", str(exc)) from None
        if self.readiness is not None:
            await require_servable(model, rollout, self.readiness, self.load_timeout_s)
        policy = replace(current, models={**current.models, model: rollout})
        await asyncio.to_thread(write_policy, self.path, policy)
        self.check_file()
        self.publish_routing()
        return rollout.to_json()

    def publish_routing(self) -> None:
        """routerkt_rollout_weight{model}: the candidate's share as routed now (readiness.routing)."""
        if self.readiness is None:
            return
        for name, rollout in self.policy.models.items():
            self.metrics.rollout_weight.labels(model=name).set(
                float(routing(name, rollout, self.readiness)["candidate_share"]))

    def apply(self, policy: RolloutPolicyFile) -> None:
        """Put `policy` in force (canaries that did not change keep their guardrail counts and tests)."""
        self.canaries.track(policy.models)
        for name in set(self.policy.models) | set(policy.models):
            self.metrics.rollout_weight.labels(model=name).set(policy.get(name).candidate_weight())
        self.policy = policy
        self.publish_routing()

    # -- guardrail and sequential test ---------------------------------------------------------------
    def check_guardrails(self) -> list[str]:
        """Roll back every canary whose guardrail trips, then promote or roll back every canary
        whose sequential test decides; returns their model names."""
        decided = []
        for name, start in list(self.canaries.started.items()):
            reason = guardrail_verdict(self.metrics.quality, name, start)
            if reason is not None:
                split = start.split
                self._pin(name, split.baseline, f"canary of version {split.candidate} rolled back by the guardrail "
                                                f"at {_stamp()}: {reason}")
                self.metrics.rollout_rollbacks.labels(model=name).inc()
                log.warning("rollout guardrail: model %s rolled back to version %d: %s", name, split.baseline, reason)
                decided.append(name)
                continue
            test = read_test(self.metrics, name, start)
            if test is not None:
                split = start.split
                self._pin(name, test.version, f"canary of version {split.candidate} over {split.baseline} "
                                              f"{test.verdict} by the sequential test at {_stamp()}: {test.reason}")
                self._decided[name] = (self.policy.models[name], test.state)
                self.metrics.rollout_decisions.labels(model=name, decision=test.decision).inc()
                log.warning("rollout sequential test: model %s %s, version %d pinned: %s", name, test.verdict,
                            test.version, test.reason)
                decided.append(name)
        return decided

    def _pin(self, name: str, version: int, note: str) -> None:
        """Pin `name` to `version` at once and rewrite the file to say so (atomically)."""
        self.apply(replace(self.policy, models={**self.policy.models, name: Pinned(version, note=note)}))
        if self.path is None:
            return
        try:
            write_policy(self.path, self.policy)
        except OSError as exc:
            log.error("pinning model %s to version %d holds in this gateway only: cannot rewrite %s: %s",
                      name, version, self.path, exc.strerror)

    def status(self) -> dict[str, object]:
        return policy_status(self.path, self.error, self.policy, self.canaries, self.readiness, self._decided)


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
