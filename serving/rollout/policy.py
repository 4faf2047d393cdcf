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
from serving.rollout.kinds.base import Guardrail, Rollout, RouteInputs, Split, requested_version
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.policy_file import PolicyError, RolloutPolicyFile, read_policy, write_policy
from serving.sessions.keys import LearnerKeys

log = logging.getLogger("routerkt.gateway.rollout")


@dataclass
class _CanaryStart:
    rollout: Rollout
    split: Split
    guard: Guardrail
    baseline: tuple[int, float]      # (outcomes, log-loss sum) when the canary began
    candidate: tuple[int, float]


class RolloutPolicy:
    """VersionPolicy from a watched policy file (see the module docstring)."""

    def __init__(self, path: Path | None, metrics: Metrics, keys: LearnerKeys | None = None,
                 rng: random.Random | None = None, poll_s: float = 1.0) -> None:
        self.path = Path(path) if path is not None else None
        self.poll_s = poll_s
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
            split, guard = rollout.split(), rollout.guardrail()
            if split is not None and guard is not None:
                kept = self._canaries.get(name)
                canaries[name] = kept if kept is not None and kept.rollout == rollout else _CanaryStart(
                    rollout, split, guard, self.metrics.quality.totals(name, split.baseline),
                    self.metrics.quality.totals(name, split.candidate))
        for name in set(self.policy.models) | set(policy.models):
            self.metrics.rollout_weight.labels(model=name).set(policy.get(name).candidate_weight())
        self.policy, self._canaries = policy, canaries

    # -- the guardrail -----------------------------------------------------------------------------
    def check_guardrails(self) -> list[str]:
        """Roll back every canary whose guardrail trips; returns their model names."""
        rolled = []
        for name, start in list(self._canaries.items()):
            verdict = self._verdict(name, start, start.guard)
            if verdict is not None:
                self._roll_back(name, start.split, verdict)
                rolled.append(name)
        return rolled

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
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        pinned = Pinned(rollout.baseline, note=f"canary of version {rollout.candidate} rolled back by the guardrail "
                                               f"at {stamp}: {reason}")
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
                    for v, s in ((start.split.baseline, start.baseline), (start.split.candidate, start.candidate))}
            models[name] = entry
        return {"file": str(self.path) if self.path else None, "error": self.error, "models": models}


def _since(now: tuple[int, float], then: tuple[int, float]) -> tuple[int, float]:
    return now[0] - then[0], now[1] - then[1]
