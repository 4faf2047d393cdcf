"""History sources (serving/parts.py: HistorySource). `RequestHistory`: the request carries the
learner's whole recent history; a gateway without a session store uses it. (With a store:
SessionHistory, serving/sessions/service.py.)"""
from __future__ import annotations

from serving import errors
from serving.catalog import ModelVersion
from serving.requests import Deadline
from serving.validation import LearnerInput


class RequestHistory:
    """The history is the one in the request; naming a learner needs a session store."""

    async def complete(self, learner: LearnerInput, model: ModelVersion, deadline: Deadline) -> LearnerInput:
        if learner.learner_id:
            raise errors.invalid_argument(f"{learner.prefix}learner_id", "this gateway runs without a session store")
        return learner
