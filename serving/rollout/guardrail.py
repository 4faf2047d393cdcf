"""The canary guardrail: roll the candidate back once both versions have min_outcomes since the canary
began and its mean log loss exceeds the baseline's by more than max_log_loss_increase."""
from __future__ import annotations

from serving.metrics.quality import OutcomeQuality
from serving.rollout.canaries import CanaryStart, since


def guardrail_verdict(quality: OutcomeQuality, name: str, start: CanaryStart) -> str | None:
    """Why the candidate must be rolled back, or None (no guardrail, too few outcomes, within the margin)."""
    guard = start.guard
    if guard is None:
        return None
    base = since(quality.totals(name, start.split.baseline), start.baseline)
    cand = since(quality.totals(name, start.split.candidate), start.candidate)
    if base[0] < guard.min_outcomes or cand[0] < guard.min_outcomes:
        return None
    base_loss, cand_loss = base[1] / base[0], cand[1] / cand[0]
    if cand_loss - base_loss <= guard.max_log_loss_increase:
        return None
    return (f"candidate {start.split.candidate} log loss {cand_loss:.4f} over {cand[0]} outcomes vs baseline "
            f"{start.split.baseline} {base_loss:.4f} over {base[0]} (allowed +{guard.max_log_loss_increase:g})")
