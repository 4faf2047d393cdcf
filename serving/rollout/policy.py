"""`RolloutPolicy`: the pipeline's VersionPolicy driven by the rollout policy file
(serving/rollout/policy_file.py), the file watcher, and the canary guardrail.

- The file is checked every settings.rollout_poll_s (its size, mtime and inode). A changed file
  that parses replaces the policy in force; one that does not is refused: the last good policy
  stays, the reason is logged once per change, routerkt_rollout_policy_ok drops to 0 and
  routerkt_rollout_policy_errors_total counts it. `status()` says the same (/v1/rollout). A file
  naming a version the model repository does not hold is refused the same way, and read again
  every poll (the version may still be on its way).
- `change()` (PUT /v1/rollout/{model}, `routerkt rollout ... --gateway`): one model's entry, refused
  when it names a version the repository lacks or that does not load (serving/rollout/readiness.py),
  else written to the file and put in force at once.
- Routing as it is: each poll, routerkt_rollout_weight{model} is the share of learners a split's
  candidate actually gets (1 while its baseline does not answer); `status()` gives each model's
  `routing` (the versions that answer, that share, and why it differs from the policy).
- Canary stickiness: learner -> LearnerKeys.bucket(learner_id, model) in [0, 1); the learner goes
  to the candidate when bucket < weight. The bucket is a keyed hash, so assignments cannot be
  predicted without the store secret, and raising the weight only moves learners to the candidate.
- Guardrail (each poll): for a canary with a guardrail, the outcomes recorded for each version
  since the canary came into force (OutcomeQuality.totals, this gateway's); once both have
  min_outcomes and the candidate's mean log loss exceeds the baseline's by more than
  max_log_loss_increase, the model is pinned to the baseline at once, the event is logged and
  counted (routerkt_rollout_rollbacks_total), and the file is rewritten to say so (a read-only
  file keeps the rollback in force in this process only, and the log says that).
- Sequential test (each poll, after the guardrail): for a canary with `promotion`, the log loss of
  every outcome of each version since the canary began feeds a SequentialTest
  (serving/rollout/sequential.py, through OutcomeQuality.follow); once both versions have
  min_outcomes and the confidence sequence for candidate - baseline excludes 0, the candidate is
  pinned (better) or the baseline (worse), the same way, counted in
  routerkt_rollout_decisions_total{model, decision}; routerkt_rollout_log_loss_difference{model,
  bound} shows the interval while the canary runs, status() its state and the last decision.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

from serving import errors
from serving.catalog import ModelVersion
from serving.metrics import Metrics
from serving.parts import Route
from serving.rollout.kinds.base import Guardrail, Rollout, RouteInputs, Split, requested_version
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy_file import PolicyError, RolloutPolicyFile, parse_model, read_policy, write_policy
from serving.rollout.readiness import Readiness, missing_versions, require_servable, routing
from serving.rollout.sequential import PROMOTE, Reading, SequentialTest
from serving.sessions.keys import LearnerKeys

log = logging.getLogger("routerkt.gateway.rollout")


class NotHeld(PolicyError):
    """The file names a version the model repository does not hold (yet): refused, read again each poll."""


@dataclass
class _CanaryStart:
    rollout: Rollout
    split: Split
    guard: Guardrail | None
    baseline: tuple[int, float]      # (outcomes, log-loss sum) when the canary began
    candidate: tuple[int, float]
    test: SequentialTest | None = None


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
        self.error: str | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._canaries: dict[str, _CanaryStart] = {}
        self._decided: dict[str, tuple[Rollout, dict[str, object]]] = {}   # model -> (the pin written, the test)
        self.check_file()

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

    # -- the file ----------------------------------------------------------------------------------
    def check_file(self) -> bool:
        """Reload the file when it changed; True when a new policy came into force."""
        if self.path is None:
            return False
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            policy = read_policy(self.path)
            self._check_held(policy)
        except PolicyError as exc:
            if isinstance(exc, NotHeld):
                self._stamp = None                             # look again next poll
                if self.error == str(exc):
                    return False
            self.error = str(exc)
            self.metrics.rollout_policy_errors.inc()
            self.metrics.rollout_policy_ok.set(0)
            log.warning("rollout policy file %s refused (the previous policy stays in force): %s", self.path, exc)
            return False
        self.error = None
        self.metrics.rollout_policy_ok.set(1)
        if policy != self.policy:
            self.apply(policy)
            log.info("rollout policy in force: %s", policy.to_json()["models"] or "latest for every model")
            return True
        return False

    def _check_held(self, policy: RolloutPolicyFile) -> None:
        """PolicyError (retried every poll) when an entry names a version the repository does not hold."""
        if self.readiness is None:
            return
        for name, rollout in sorted(policy.models.items()):
            missing = missing_versions(name, rollout, self.readiness)
            if missing:
                raise NotHeld(f"models.{name}: version {missing[0]} is not in the model repository "
                              f"(it holds {sorted(self.readiness.versions(name))})")

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
        """Put `policy` in force (canaries that did not change keep their guardrail counts)."""
        canaries = {}
        for name, rollout in policy.models.items():
            split, guard, promotion = rollout.split(), rollout.guardrail(), rollout.promotion()
            if split is not None and (guard is not None or promotion is not None):
                kept = self._canaries.get(name)
                canaries[name] = kept if kept is not None and kept.rollout == rollout else self._start(
                    name, rollout, split, guard, promotion)
        for name, start in self._canaries.items():
            if canaries.get(name) is not start:
                self._stop(name, start)
        for name in set(self.policy.models) | set(policy.models):
            self.metrics.rollout_weight.labels(model=name).set(policy.get(name).candidate_weight())
        self.policy, self._canaries = policy, canaries
        self.publish_routing()

    def _start(self, name: str, rollout: Rollout, split: Split, guard: Guardrail | None, promotion) -> _CanaryStart:
        quality = self.metrics.quality
        start = _CanaryStart(rollout, split, guard, quality.totals(name, split.baseline),
                             quality.totals(name, split.candidate))
        if promotion is not None:
            start.test = SequentialTest(promotion.alpha, promotion.min_outcomes)
            quality.follow(name, split.baseline, start.test.add_baseline)
            quality.follow(name, split.candidate, start.test.add_candidate)
        return start

    def _stop(self, name: str, start: _CanaryStart) -> None:
        if start.test is not None:
            self.metrics.quality.unfollow(name, start.split.baseline, start.test.add_baseline)
            self.metrics.quality.unfollow(name, start.split.candidate, start.test.add_candidate)
            for bound in ("lower", "upper"):
                try:
                    self.metrics.rollout_difference.remove(name, bound)
                except KeyError:
                    pass

    # -- the guardrail -----------------------------------------------------------------------------
    def check_guardrails(self) -> list[str]:
        """Roll back every canary whose guardrail trips, then promote or roll back every canary
        whose sequential test decides; returns their model names."""
        decided = []
        for name, start in list(self._canaries.items()):
            verdict = self._verdict(name, start, start.guard) if start.guard is not None else None
            if verdict is not None:
                self._roll_back(name, start.split, verdict)
                decided.append(name)
            elif start.test is not None and self._check_test(name, start, start.test):
                decided.append(name)
        return decided

    def _check_test(self, name: str, start: _CanaryStart, test: SequentialTest) -> bool:
        reading = test.read()
        if min(reading.outcomes) > 0:
            self.metrics.rollout_difference.labels(model=name, bound="lower").set(reading.lower)
            self.metrics.rollout_difference.labels(model=name, bound="upper").set(reading.upper)
        if not reading.decision:
            return False
        split = start.split
        version = split.candidate if reading.decision == PROMOTE else split.baseline
        verdict = "promoted" if reading.decision == PROMOTE else "rolled back"
        reason = (f"candidate - baseline mean clipped log loss in [{reading.lower:+.4f}, {reading.upper:+.4f}] "
                  f"at confidence {1 - test.alpha:g} after {reading.outcomes[1]} / {reading.outcomes[0]} outcomes")
        note = (f"canary of version {split.candidate} over {split.baseline} {verdict} by the sequential test at "
                f"{_stamp()}: {reason}")
        state = self._test_json(start, test, reading)
        self._pin(name, version, note)
        self._decided[name] = (self.policy.models[name], state)
        self.metrics.rollout_decisions.labels(model=name, decision=reading.decision).inc()
        log.warning("rollout sequential test: model %s %s, version %d pinned: %s", name, verdict, version, reason)
        return True

    def _verdict(self, name: str, start: _CanaryStart, guard: Guardrail) -> str | None:
        base = _since(self.metrics.quality.totals(name, start.split.baseline), start.baseline)
        cand = _since(self.metrics.quality.totals(name, start.split.candidate), start.candidate)
        if base[0] < guard.min_outcomes or cand[0] < guard.min_outcomes:
            return None
        base_loss, cand_loss = base[1] / base[0], cand[1] / cand[0]
        if cand_loss - base_loss <= guard.max_log_loss_increase:
            return None
        return (f"candidate {start.split.candidate} log loss {cand_loss:.4f} over {cand[0]} outcomes vs baseline "
                f"{start.split.baseline} {base_loss:.4f} over {base[0]} (allowed +{guard.max_log_loss_increase:g})")

    def _roll_back(self, name: str, rollout: Split, reason: str) -> None:
        self._pin(name, rollout.baseline, f"canary of version {rollout.candidate} rolled back by the guardrail "
                                          f"at {_stamp()}: {reason}")
        self.metrics.rollout_rollbacks.labels(model=name).inc()
        log.warning("rollout guardrail: model %s rolled back to version %d: %s", name, rollout.baseline, reason)

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

    # -- status ------------------------------------------------------------------------------------
    def status(self) -> dict[str, object]:
        models = {}
        for name, rollout in self.policy.models.items():
            entry: dict[str, object] = rollout.to_json()
            start = self._canaries.get(name)
            if start is not None:
                entry["since_canary_began"] = {
                    str(v): dict(zip(("outcomes", "log_loss_sum"), _since(self.metrics.quality.totals(name, v), s)))
                    for v, s in ((start.split.baseline, start.baseline), (start.split.candidate, start.candidate))}
            if self.readiness is not None:
                entry["routing"] = routing(name, rollout, self.readiness)
            models[name] = entry
        tests = {name: self._test_json(start, start.test, start.test.read())
                 for name, start in self._canaries.items() if start.test is not None}
        tests.update({name: state for name, (pin, state) in self._decided.items()
                      if self.policy.models.get(name) == pin})
        return {"file": str(self.path) if self.path else None, "error": self.error, "models": models,
                "sequential_tests": tests}

    @staticmethod
    def _test_json(start: _CanaryStart, test: SequentialTest, reading: Reading) -> dict[str, object]:
        return {"baseline": start.split.baseline, "candidate": start.split.candidate,
                **reading.to_json(test.alpha, test.min_outcomes)}


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _since(now: tuple[int, float], then: tuple[int, float]) -> tuple[int, float]:
    return now[0] - then[0], now[1] - then[1]
