"""History sources (serving/parts.py: HistorySource). `RequestHistory`: the request carries the
learner's whole recent history, as every Predict did so far; nothing is stored."""
from __future__ import annotations

from serving.validation import LearnerInput


class RequestHistory:
    """The history is the one in the request."""

    async def complete(self, learner: LearnerInput) -> LearnerInput:
        return learner
