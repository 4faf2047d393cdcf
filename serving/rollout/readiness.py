"""What the rollout needs to know of the served versions: which the repository holds, which answer
now, and how to bring one back; with it, a change naming a version that cannot answer is refused and
the status says what the gateway actually routes (not only what the policy asks for)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from serving import status_errors as errors
from serving.rollout.kinds.base import Rollout


class Readiness(Protocol):
    """The repository's versions of a model and the backend's readiness of each."""

    def versions(self, model: str) -> list[int]:
        """Versions the model repository holds (the catalog)."""

    def ready(self, model: str) -> frozenset[int]:
        """Versions the backend answers with right now."""

    async def ensure_ready(self, model: str, version: int, timeout_s: float) -> bool:
        """Ask the backend to load `version` when it is in the repository but not answering; True once ready."""


@dataclass(frozen=True)
class BackendReadiness:
    """Readiness over the gateway's catalog and inference backend (assembled by create_server)."""

    versions: Callable[[str], list[int]]
    ready: Callable[[str], frozenset[int]]
    ensure_ready: Callable[[str, int, float], Awaitable[bool]]


async def require_servable(model: str, rollout: Rollout, readiness: Readiness, timeout_s: float) -> None:
    """Raise FAILED_PRECONDITION when `rollout` names a version the repository does not hold, UNAVAILABLE
    when one is held but does not answer within `timeout_s` (asked to load first). Nothing is changed."""
    held = set(readiness.versions(model))
    for version in sorted(rollout.versions()):
        if version not in held:
            raise errors.failed_precondition(
                f"model {errors.shown(model)} version {version} is not in the model repository (it holds "
                f"{sorted(held)}); nothing changed")
    for version in sorted(rollout.versions()):
        if version not in readiness.ready(model) and not await readiness.ensure_ready(model, version, timeout_s):
            raise errors.unavailable(
                f"model {errors.shown(model)} version {version} is in the repository but did not load within "
                f"{timeout_s:g}s; nothing changed")


def missing_versions(model: str, rollout: Rollout, readiness: Readiness) -> list[int]:
    """Versions `rollout` names that the repository does not hold (for a model the catalog knows)."""
    held = set(readiness.versions(model))
    return sorted(rollout.versions() - held) if held else []


def routing(model: str, rollout: Rollout, readiness: Readiness) -> dict[str, object]:
    """What the gateway does for `model` now: the versions that answer, the share of learners on a
    split's candidate as routed (1.0 while its baseline does not answer, 0.0 while the candidate does
    not), and a sentence when that differs from the policy."""
    ready = readiness.ready(model)
    share = rollout.candidate_weight()
    split = rollout.split()
    note = ""
    if split is not None:
        baseline_ok, candidate_ok = split.baseline in ready, split.candidate in ready
        if not baseline_ok and candidate_ok:
            share, note = 1.0, f"baseline {split.baseline} does not answer: every learner gets {split.candidate}"
        elif baseline_ok and not candidate_ok:
            share, note = 0.0, f"candidate {split.candidate} does not answer: every learner gets {split.baseline}"
        elif not baseline_ok:
            share, note = 0.0, f"neither {split.baseline} nor {split.candidate} answers: calls fail (UNAVAILABLE)"
    else:
        named = rollout.versions()
        if named and not named & ready:
            note = f"version {min(named)} does not answer: calls fail (UNAVAILABLE)"
    out: dict[str, object] = {"ready": sorted(ready), "candidate_share": share}
    if note:
        out["note"] = note
    return out
