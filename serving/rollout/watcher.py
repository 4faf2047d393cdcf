"""The rollout policy file, watched: re-read when its size, mtime or inode changed; a file that does not
parse, or names a version the model repository does not hold, is refused (the caller keeps the policy in
force); the latter is read again every poll, as the version may be on its way."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from serving.metrics import Metrics
from serving.rollout.policy_file import PolicyError, RolloutPolicyFile, read_policy
from serving.rollout.readiness import Readiness, missing_versions

log = logging.getLogger("routerkt.gateway.rollout")


class NotHeld(PolicyError):
    """The file names a version the model repository does not hold (yet): refused, read again each poll."""


class PolicyWatcher:
    """`poll()`: the file's policy when it changed and is good; `error`: why the last change was refused."""

    def __init__(self, path: Path, metrics: Metrics, readiness: Readiness | None = None) -> None:
        self.path, self.metrics, self.readiness = path, metrics, readiness
        self.error: str | None = None
        self._stamp: tuple[int, int, int] | None = None

    def poll(self) -> RolloutPolicyFile | None:
        """The file's policy when it changed since the last poll and is accepted, else None."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            policy = read_policy(self.path)
            self._check_held(policy)
        except PolicyError as exc:
            if isinstance(exc, NotHeld):
                self._stamp = None                             # look again next poll
                if self.error == str(exc):
                    return None
            self.error = str(exc)
            self.metrics.rollout_policy_errors.inc()
            self.metrics.rollout_policy_ok.set(0)
            log.warning("rollout policy file %s refused (the previous policy stays in force): %s", self.path, exc)
            return None
        self.error = None
        self.metrics.rollout_policy_ok.set(1)
        return policy

    def _check_held(self, policy: RolloutPolicyFile) -> None:
        if self.readiness is None:
            return
        for name, rollout in sorted(policy.models.items()):
            missing = missing_versions(name, rollout, self.readiness)
            if missing:
                raise NotHeld(f"models.{name}: version {missing[0]} is not in the model repository "
                              f"(it holds {sorted(self.readiness.versions(name))})")
