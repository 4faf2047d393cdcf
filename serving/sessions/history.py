"""History sources (serving/pipeline/parts.py: HistorySource). `RequestHistory`: the request carries the
learner's whole recent history; a gateway without a session store uses it. `SessionHistory`: the
session store's history when the request names the learner, else the request's."""
from __future__ import annotations

from serving import status_errors as errors
from serving.core.catalog import ModelVersion
from serving.core.calls import Deadline
from serving.sessions.keys import LearnerKeys
from serving.sessions.store_calls import StoreCalls
from serving.core.validation import LearnerInput


class RequestHistory:
    """The history is the one in the request; naming a learner needs a session store."""

    async def complete(self, learner: LearnerInput, model: ModelVersion, deadline: Deadline) -> LearnerInput:
        if learner.learner_id:
            raise errors.invalid_argument(f"{learner.prefix}learner_id", "this gateway runs without a session store")
        return learner


class SessionHistory:
    """HistorySource: the store's history when the learner is named, else the request's; the learner's
    keyed hash is computed here, once per call, and carried in the result (`LearnerInput.learner_key`)."""

    def __init__(self, calls: StoreCalls, keys: LearnerKeys, store_keep: int) -> None:
        self.calls, self.keys, self.store_keep = calls, keys, store_keep

    async def complete(self, learner: LearnerInput, model: ModelVersion, deadline: Deadline) -> LearnerInput:
        if not learner.learner_id:
            return learner
        key = self.keys.learner(learner.learner_id)
        # a band model reads the whole retained history (its state covers it), a window model its last W - 1
        limit = self.store_keep if model.band else max(model.window - 1, 0)
        stored = await self.calls.history(key, max(limit, model.window - 1, 0), deadline)
        # a stored skill this version does not know is mapped to the unknown id by the encoder, as in a request
        return LearnerInput(stored.questions, stored.skills, stored.correct, learner.candidate_questions,
                            learner.candidate_skills, learner.prefix, learner.learner_id,
                            candidate_sets=learner.candidate_sets, learner_key=key)
