"""`RolloutPolicy`: the pipeline's VersionPolicy driven by the rollout policy file
(serving/rollout/policy_file.py), the file watcher, and the canary guardrail.

- The file is checked every settings.rollout_poll_s (its size, mtime and inode). A changed file
  that parses replaces the policy in force; one that does not is refused: the last good policy
  stays, the reason is logged once per change, routerkt_rollout_policy_ok drops to 0 and
  routerkt_rollout_policy_errors_total counts it. `status()` says the same (/v1/rollout).
- Canary stickiness: learner -> LearnerKeys.bucket(learner_id, model) in [0, 1); the learner goes
  to the candidate when bucket < weight. The bucket is a keyed hash, so assignments cannot be
  predicted without the store secret, and raising the weight only moves learners to the candidate.
- Guardrail (each poll): for a canary with a guardrail, the outcomes recorded for each version
  since the canary came into force (OutcomeQuality.totals, this gateway's); once both have
  min_outcomes and the candidate's mean log loss exceeds the baseline's by more than
  max_log_loss_increase, the model is pinned to the baseline at once, the event is logged and
  counted (routerkt_rollout_rollbacks_total), and the file is rewritten to say so (a read-only
  file keeps the rollback in force in this process only, and the log says that).
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

from serving.catalog import ModelVersion
from serving.metrics import Metrics
from serving.parts import Route
from serving.rollout.policy_file import (Guardrail, ModelRollout, PolicyError, PolicyKind, RolloutPolicyFile,
                                         read_policy, write_policy)
from serving.sessions.keys import LearnerKeys
from serving.version_policy import latest_ready, requested_version
from serving import errors

log = logging.getLogger("routerkt.gateway.rollout")


@dataclass
class _CanaryStart:
    rollout: ModelRollout
    baseline: tuple[int, float]      # (outcomes, log-loss sum) when the canary began
    candidate: tuple[int, float]


class RolloutPolicy:
    """VersionPolicy from a watched policy file (see the module docstring)."""

    def __init__(self, path: Path | None, metrics: Metrics, keys: LearnerKeys | None = None,
                 rng: random.Random | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.metrics = metrics
        self.keys = keys
        self.rng = rng or random.Random()
        self.policy = RolloutPolicyFile()
        self.error: str | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._canaries: dict[str, _CanaryStart] = {}
        self.check_file()

    # -- VersionPolicy -----------------------------------------------------------------------------
    def route(self, name: str, requested: int, versions: Mapping[int, ModelVersion], ready: frozenset[int],
              learner_id: str = "") -> Route:
        if requested:
            return Route(requested_version(name, requested, versions, ready))
        rollout = self.policy.get(name)
        if rollout.kind is PolicyKind.LATEST:
            return Route(latest_ready(name, versions, ready))
        if rollout.kind is PolicyKind.PINNED:
            return Route(self._served(name, rollout.version, versions, ready))
        baseline_ok = rollout.baseline in versions and rollout.baseline in ready
        candidate_ok = rollout.candidate in versions and rollout.candidate in ready
        if not baseline_ok and not candidate_ok:
            raise errors.unavailable(f"model {errors.shown(name)} versions {rollout.baseline} and "
                                     f"{rollout.candidate} are not ready; retry shortly")
        if rollout.kind is PolicyKind.CANARY:
            to_candidate = self._bucket(name, learner_id) < rollout.weight
            pick = rollout.candidate if (to_candidate and candidate_ok) or not baseline_ok else rollout.baseline
            return Route(versions[pick])
        primary = versions[rollout.baseline] if baseline_ok else versions[rollout.candidate]
        shadow = versions[rollout.candidate] if baseline_ok and candidate_ok and \
            self.rng.random() < rollout.sample else None
        return Route(primary, shadow)

    def _served(self, name: str, version: int, versions: Mapping[int, ModelVersion], ready: frozenset[int]):
        if version not in versions:
            raise errors.unavailable(f"model {errors.shown(name)} is pinned to version {version}, which the "
                                     "repository does not hold")
        return requested_version(name, version, versions, ready)

    def _bucket(self, name: str, learner_id: str) -> float:
        if learner_id and self.keys is not None:
            return self.keys.bucket(learner_id, name)
        return self.rng.random()

    async def maintain(self, poll_s: float) -> None:
        """Watch the file and run the guardrail every `poll_s` until cancelled."""
        while True:
            await asyncio.sleep(poll_s)
            try:
                self.check_file()
                self.check_guardrails()
            except Exception:                                  # never let the loop die
                log.exception("rollout policy upkeep failed")

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
        except PolicyError as exc:
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

    def apply(self, policy: RolloutPolicyFile) -> None:
        """Put `policy` in force (canaries that did not change keep their guardrail counts)."""
        canaries = {}
        for name, rollout in policy.models.items():
            if rollout.kind is PolicyKind.CANARY:
                kept = self._canaries.get(name)
                canaries[name] = kept if kept is not None and kept.rollout == rollout else _CanaryStart(
                    rollout, self.metrics.quality.totals(name, rollout.baseline),
                    self.metrics.quality.totals(name, rollout.candidate))
        for name in set(self.policy.models) | set(policy.models):
            rollout = policy.get(name)
            self.metrics.rollout_weight.labels(model=name).set(
                rollout.weight if rollout.kind is PolicyKind.CANARY else 0.0)
        self.policy, self._canaries = policy, canaries

    # -- the guardrail -----------------------------------------------------------------------------
    def check_guardrails(self) -> list[str]:
        """Roll back every canary whose guardrail trips; returns their model names."""
        rolled = []
        for name, start in list(self._canaries.items()):
            guard = start.rollout.guardrail
            if guard is None:
                continue
            verdict = self._verdict(name, start, guard)
            if verdict is not None:
                self._roll_back(name, start.rollout, verdict)
                rolled.append(name)
        return rolled

    def _verdict(self, name: str, start: _CanaryStart, guard: Guardrail) -> str | None:
        base = _since(self.metrics.quality.totals(name, start.rollout.baseline), start.baseline)
        cand = _since(self.metrics.quality.totals(name, start.rollout.candidate), start.candidate)
        if base[0] < guard.min_outcomes or cand[0] < guard.min_outcomes:
            return None
        base_loss, cand_loss = base[1] / base[0], cand[1] / cand[0]
        if cand_loss - base_loss <= guard.max_log_loss_increase:
            return None
        return (f"candidate {start.rollout.candidate} log loss {cand_loss:.4f} over {cand[0]} outcomes vs baseline "
                f"{start.rollout.baseline} {base_loss:.4f} over {base[0]} (allowed +{guard.max_log_loss_increase:g})")

    def _roll_back(self, name: str, rollout: ModelRollout, reason: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        pinned = ModelRollout(PolicyKind.PINNED, version=rollout.baseline,
                              note=f"canary of version {rollout.candidate} rolled back by the guardrail at {stamp}: "
                                   f"{reason}")
        self.apply(replace(self.policy, models={**self.policy.models, name: pinned}))
        self.metrics.rollout_rollbacks.labels(model=name).inc()
        log.warning("rollout guardrail: model %s rolled back to version %d: %s", name, rollout.baseline, reason)
        if self.path is None:
            return
        try:
            write_policy(self.path, self.policy)
        except OSError as exc:
            log.error("the rollback of model %s holds in this gateway only: cannot rewrite %s: %s",
                      name, self.path, exc.strerror)

    # -- status ------------------------------------------------------------------------------------
    def status(self) -> dict[str, object]:
        models = {}
        for name, rollout in self.policy.models.items():
            entry: dict[str, object] = rollout.to_json()
            start = self._canaries.get(name)
            if start is not None:
                entry["since_canary_began"] = {
                    str(v): dict(zip(("outcomes", "log_loss_sum"), _since(self.metrics.quality.totals(name, v), s)))
                    for v, s in ((rollout.baseline, start.baseline), (rollout.candidate, start.candidate))}
            models[name] = entry
        return {"file": str(self.path) if self.path else None, "error": self.error, "models": models,
                "quality": self.metrics.quality.summary()}


def _since(now: tuple[int, float], then: tuple[int, float]) -> tuple[int, float]:
    return now[0] - then[0], now[1] - then[1]
