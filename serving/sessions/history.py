"""History sources (serving/pipeline/parts.py: HistorySource). `RequestHistory`: the request carries the
learner's whole recent history; a gateway without a session store uses it. `SessionHistory`: the
session store's history when the request names the learner, else the request's."""
from __future__ import annotations

from serving import status_errors as errors
from serving.core.catalog import ModelVersion
from serving.core.calls import Deadline
from serving.pipeline.parts import CachedState, StateLookup
from serving.sessions.keys import LearnerKeys
from serving.sessions.store import History
from serving.sessions.store_calls import StoreCalls
from serving.core.validation import LearnerInput


class RequestHistory:
    """The history is the one in the request; naming a learner needs a session store."""

    async def complete(self, learner: LearnerInput, model: ModelVersion, deadline: Deadline,
                       states: StateLookup | None = None) -> LearnerInput:
        if learner.learner_id:
            raise errors.invalid_argument(f"{learner.prefix}learner_id", "this gateway runs without a session store")
        return learner


class SessionHistory:
    """HistorySource: the store's history when the learner is named, else the request's; the learner's
    keyed hash is computed here, once per call, and carried in the result (`LearnerInput.learner_key`)."""

    def __init__(self, calls: StoreCalls, keys: LearnerKeys, store_keep: int) -> None:
        self.calls, self.keys, self.store_keep = calls, keys, store_keep

    async def complete(self, learner: LearnerInput, model: ModelVersion, deadline: Deadline,
                       states: StateLookup | None = None) -> LearnerInput:
        if not learner.learner_id:
            return learner
        key = self.keys.learner(learner.learner_id)
        # a band model reads the whole retained history (its state covers it), a window model its last W - 1
        limit = max(self.store_keep if model.band else max(model.window - 1, 0), model.window - 1, 0)
        if states is not None:
            since = await self._since(key, model, limit, states, deadline)
            if since is not None:
                stored, entry = since
                return self._with(learner, stored, key, entry)
        # a stored skill this version does not know is mapped to the unknown id by the encoder, as in a request
        return self._with(learner, await self.calls.history(key, limit, deadline), key, None)

    async def _since(self, key: str, model: ModelVersion, limit: int, states: StateLookup,
                     deadline: Deadline) -> tuple[History, CachedState] | None:
        """The events stored after the learner's cached state, when the store's log still continues it: its
        newest `max_appends` events and the log's revision in one small read, then the rule: nothing
        trimmed from the front, at most max_appends appended, and the state (with them) covering exactly
        what the whole read would return. None: read the whole history."""
        await states.settled(key, max(deadline.remaining(), 0.0) / 2)
        entry = states.cached(model, key)
        if entry is None or entry.revision is None:
            return None
        tail = await self.calls.history(key, max(states.max_appends, 1), deadline, "history_since")
        appended = None if tail.revision is None else tail.revision.appended_since(entry.revision)
        if appended is None or appended > min(states.max_appends, tail.questions.shape[0]):
            return None
        if entry.length != min(entry.revision.kept, limit) or (appended and tail.revision.kept > limit):
            return None
        return tail.last(appended), entry

    @staticmethod
    def _with(learner: LearnerInput, stored: History, key: str, entry: CachedState | None) -> LearnerInput:
        return LearnerInput(stored.questions, stored.skills, stored.correct, learner.candidate_questions,
                            learner.candidate_skills, learner.prefix, learner.learner_id,
                            candidate_sets=learner.candidate_sets, learner_key=key, revision=stored.revision,
                            cached=entry)
