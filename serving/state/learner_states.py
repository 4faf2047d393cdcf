"""LearnerStates: Predict by learner_id from the learner's cached step-graph state, so that a stored learner's
next prediction costs the interactions added since, plus the candidates' query rows (issue 50).

A named learner whose entry the store's log still continues (serving/sessions/history.py: one small read of
the newest events and the log's revision) comes with only the events stored after the entry: they are appended
to it (`appended`; none: `hit`), without the whole history. For any other named learner (its history read from
the session store and encoded as usual) the cache entry of (model, version, learner key) decides, by the kept
history the entry was computed from (serving/state/cache.py):
- hit: the same kept history -> step_next only (the candidates against the cached keys);
- appended: the entry's history is a prefix and at most `max_appends` interactions were added ->
  one step_append per added interaction, then step_next;
- miss (no entry) or stale (not a prefix: a new event order, a window that slid past W - 1, a
  forgotten learner observed again, more than max_appends added) -> step_start on the kept history
  (the rebuild of routerkt/contract/step_signature.py, exact at the window edge), then step_next.
A band model (ModelVersion.band) keeps the whole history (the store's retained events): its window never
slides, so an added answer is always `appended`; its rebuild is step_start on the first W - 1 interactions
and step_append of the rest, W - 1 at a time. Its entry keeps the last W - 1 interactions and a
fingerprint of the ones before (serving/state/cache.py), a fixed size at any length.
Every path gives the rank graph's probabilities on the same kept history (<= 1e-5; the e2e and
integration tests compare them), so a miss or an eviction costs time, never a different answer.
Where a state lives between calls is its placement (serving/state/placement.py): the entry's own tensors, sent
with every step call, or a key under which Triton holds it (`held`); a held state Triton no longer has raises
StateLost, and the caller answers again from whole histories. The new state is cached after the call.
Learners are taken in chunks of at most `rows` per backend call, and a learner's candidates in pieces of at
most `candidates` (as the rank path splits them).
Observe's fill (`observed`, run in the background by serving/pipeline/state_fill.py) appends a learner's
newly stored answers to its entry ahead of the next Predict, whose history source waits for a fill in flight
(`settled`) instead of appending the same answers again; whatever a fill leaves, the prefix rule above still
decides.

The prefix cache (`--prefix-cache`, off by default): a stateless Predict (the history sent in the request)
looks up the same cache by a hash of its kept history and of that history without its last 1 ..
`max_appends` interactions (`history_keys`), so a caller that resends a learner's history with one more
answer appends; the entry used is then dropped and the new one stored under the full history's hash.
The hash only finds an entry: the entry is used only when its stored history is a prefix (as above).
"""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Awaitable, Callable

import numpy as np

from routerkt.contract.signature import PAD_ID
from routerkt.contract.step_signature import STEP_GRAPHS
from serving.core.encoded import EncodedLearner, StepFeeds
from serving.core.revision import Revision
from serving.state.cache import LearnerState, StateCache
from serving.state.fingerprint import extend
from serving.state.placement import PLACES, GatewayPlace, HeldPlace, Kept, StateLost, held_slot, slot_of

if TYPE_CHECKING:
    from serving.core.catalog import ModelVersion

MAX_APPENDS = 4          # beyond: one step_start instead of more sequential step_append calls
StepCall = Callable[[str, dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]   # (graph, feeds) -> outputs
Lookup = Callable[[str, str, str], None]                                     # (model, key kind, result): a metric


HISTORY = "history:"     # prefix-cache keys: a content hash, apart from the keyed learner hashes (hex)


@dataclass(frozen=True)
class Keys:
    """Where one learner's state is looked up and stored (`NONE`: nowhere, the step path only)."""

    kind: str                        # learner | history: the lookups metric's `key` label
    store: str                       # the entry written after the call
    tried: tuple[str, ...]           # the entries looked up, the longest history first


NONE = Keys("none", "", ())


@dataclass
class _Learner:
    index: int                       # in the call's learners
    encoded: EncodedLearner
    keys: Keys
    state: LearnerState | None       # the cached entry, then the updated one
    appends: int | None              # interactions to append; None: rebuild
    found: str | None = None         # the key the cached entry was found under
    base: int = 0                    # interactions before `encoded`'s first (Observe's fill: the entry's offset)
    prior: int = 0                   # their fingerprint
    revision: Revision | None = None  # the store's log the new state covers (None: unknown)


class LearnerStates:
    """The learner-state path over a StateCache (see the module docstring)."""

    def __init__(self, cache: StateCache, encoder: StepFeeds, on_lookup: Lookup = lambda model, kind, result: None,
                 max_appends: int = MAX_APPENDS) -> None:
        self.cache = cache
        self.encoder = encoder              # the pipeline's Encoder: it builds the step graphs' feeds too
        self.on_lookup = on_lookup
        self.max_appends = max_appends
        self.filling: dict[str, asyncio.Future] = {}    # learner key -> Observe's fill in flight (state_fill.py)

    def fill_started(self, learner_key: str, fill: asyncio.Future) -> None:
        """An Observe's fill of the learner is running: its next Predict waits for it (until it is done)."""
        self.filling[learner_key] = fill

        def done(_: asyncio.Future) -> None:
            if self.filling.get(learner_key) is fill:
                del self.filling[learner_key]
        fill.add_done_callback(done)

    async def settled(self, learner_key: str, wait_s: float) -> None:
        """Return once no Observe's fill of the learner is running (at most `wait_s`): the history source asks
        before it reads the entry, so a Predict right after an Observe is a hit, not an append done twice."""
        fill = self.filling.get(learner_key)
        if fill is not None:
            await asyncio.wait({fill}, timeout=wait_s)

    def forget(self, learner_key: str) -> int:
        """Drop the learner's cached states (ForgetLearner; `learner_key`: the keyed hash)."""
        return self.cache.forget(learner_key)

    def held_by(self, learner_key: str) -> dict[tuple[str, int], list[int]]:
        """(model, version) -> the keys the backend holds the learner's states under (placement.py)."""
        held: dict[tuple[str, int], list[int]] = {}
        for name, version in self.cache.versions_of(learner_key):
            entry = self.cache.peek(name, version, learner_key)
            if entry is not None and entry.held is not None:
                held.setdefault((name, version), []).append(entry.held)
        return held

    def cached(self, model: ModelVersion, learner_key: str) -> LearnerState | None:
        """The learner's entry for `model` (the history source's StateLookup: serving/sessions/history.py)."""
        return self.cache.peek(model.name, model.version, learner_key)

    def history_keys(self, learner: EncodedLearner) -> Keys:
        """A stateless learner (the prefix cache): hashes of its kept history and of that history without
        its last 1 .. max_appends interactions."""
        n = learner.history_used
        tried = tuple(_history_hash(learner, m) for m in range(n, max(n - self.max_appends, 0) - 1, -1))
        return Keys("history", tried[0], tried)

    async def predict(self, model: ModelVersion, keys: list[Keys], learners: list[EncodedLearner],
                      run: StepCall, rows: int, candidates: int,
                      read: list[tuple[LearnerState | None, Revision | None]] | None = None,
                      held: bool = False) -> list[np.ndarray]:
        """P(correct) per candidate, float32 [C_i], of each learner (`keys`: where its state is cached; its
        encoded kept history and candidates in `learners`), answered by `model`'s step graphs through `run`
        (the history source has waited for an Observe's fill in flight first: `settled`).
        `read[i]`: (the entry whose later events alone `learners[i]` holds, or None for a whole history; the
        store's log revision the history was read at, kept with the new entry). `held`: the backend holds
        the states (serving/state/placement.py); a held state it has lost raises StateLost after every
        entry of the chunk is dropped, so that the caller's second try reads whole histories and rebuilds."""
        place = PLACES[held and all(k.store for k in keys)]        # NONE: nothing to keep, nowhere to hold
        read = read or [(None, None)] * len(learners)
        plans = [self._continue(model, i, k, learner, entry) if entry is not None else self._plan(model, i, k, learner)
                 for i, (k, learner, (entry, _)) in enumerate(zip(keys, learners, read))]
        for plan, (_, revision) in zip(plans, read):
            plan.revision = revision
        if any(_kept_elsewhere(p.state, place.held) for p in plans):
            self._drop(model, plans)          # kept in the other place (the model's config changed): rebuild
            raise StateLost("a cached state is kept elsewhere")
        out: list[np.ndarray] = [np.empty(0, np.float32)] * len(learners)
        for first in range(0, len(plans), rows):
            chunk = plans[first:first + rows]
            try:
                await self._update(model, chunk, run, place)
            except StateLost:
                self._drop(model, chunk)
                raise
            for plan in chunk:
                self._keep(model, plan)
            try:
                answered = await self._next(model, chunk, run, candidates, place)
            except StateLost:
                self._drop(model, chunk)
                raise
            for plan, probs in zip(chunk, answered):
                out[plan.index] = probs
        return out

    def _keep(self, model: ModelVersion, plan: _Learner) -> None:
        """Cache the learner's new state; a hit whose entry is still the cached one, at the same revision, only
        becomes the most recently used."""
        if plan.found is not None and plan.found != plan.keys.store:
            self.cache.forget(plan.found)            # a shorter history's entry, now superseded
        if not plan.keys.store:                      # NONE: a stateless band model's long history
            return
        if (plan.appends == 0 and plan.found == plan.keys.store and plan.state.revision == plan.revision
                and self.cache.get(model.name, model.version, plan.keys.store) is plan.state):
            return
        self.cache.put(model.name, model.version, plan.keys.store, replace(plan.state, revision=plan.revision))

    def _drop(self, model: ModelVersion, chunk: list[_Learner]) -> None:
        """Forget the chunk's entries (a held state of one of them was lost)."""
        for plan in chunk:
            for key in {plan.keys.store, plan.found} - {"", None}:
                self.cache.discard(model.name, model.version, key)

    async def observed(self, model: ModelVersion, learner_key: str, new: EncodedLearner, run: StepCall,
                       revision: Revision | None = None, held: bool = False) -> str | None:
        """Observe's fill: the learner's cached state of `model` advanced by the newly stored interactions
        (`new`, in model ids, oldest first), so that its next Predict is a hit. "filled"; "dropped" when
        the window would slide past W - 1 or more than max_appends arrived (the next Predict rebuilds);
        "superseded" when a Predict replaced the entry meanwhile (its state is kept); "lost" when the backend
        no longer holds the entry's state (dropped: the next Predict rebuilds); None: no entry."""
        state = self.cache.get(model.name, model.version, learner_key)
        count = new.history_used
        if state is None or count == 0:
            return None
        if count > self.max_appends or (not model.band and state.length + count > max(model.window - 1, 0)):
            self.cache.discard(model.name, model.version, learner_key)
            return "dropped"
        plan = self._continue(model, 0, self.learner_keys_of(learner_key), new, state, lookup=False)
        if _kept_elsewhere(state, held):
            self._drop(model, [plan])
            return "lost"
        try:
            await self._update(model, [plan], run, PLACES[held])
        except StateLost:
            self._drop(model, [plan])
            return "lost"
        if self.cache.peek(model.name, model.version, learner_key) is not state:
            return "superseded"
        # the store's log after Observe's append, when that append alone followed the state's log
        follows = (state.revision is not None and revision is not None and state.length == state.revision.kept
                   and revision.appended_since(state.revision) == count)
        self.cache.put(model.name, model.version, learner_key, replace(plan.state,
                                                                       revision=revision if follows else None))
        return "filled"

    @staticmethod
    def learner_keys_of(learner_key: str) -> Keys:
        """A learner by its keyed hash (Observe has hashed the id already)."""
        return Keys("learner", learner_key, (learner_key,))

    def _continue(self, model: ModelVersion, index: int, keys: Keys, new: EncodedLearner,
                  state: LearnerState, lookup: bool = True) -> _Learner:
        """The plan of appending `new` (encoded, no window cut) to the cached `state` (none to append: the
        state's own history, nothing copied)."""
        if new.history_used == 0:
            history = EncodedLearner(state.questions, state.skills, state.responses, new.candidate_questions,
                                     new.candidate_skills)
        else:
            width = max(state.skills.shape[1], new.skills.shape[1])
            widen = self.encoder.widen
            history = EncodedLearner(np.concatenate([state.questions, new.questions]),
                                     np.concatenate([widen(state.skills, width), widen(new.skills, width)]),
                                     np.concatenate([state.responses, new.responses]),
                                     new.candidate_questions, new.candidate_skills)
        if lookup:
            self.on_lookup(model.name, keys.kind, "hit" if new.history_used == 0 else "appended")
        return _Learner(index, history, keys, state, new.history_used, keys.store, base=state.offset,
                        prior=state.prior)

    def _plan(self, model: ModelVersion, index: int, keys: Keys, learner: EncodedLearner) -> _Learner:
        seen = None
        for key in keys.tried:
            state = self.cache.get(model.name, model.version, key)
            if state is None:
                continue
            seen = state
            appends = state.extended_by(learner.questions, learner.skills, learner.responses)
            if appends is not None and appends <= self.max_appends:
                self.on_lookup(model.name, keys.kind, "hit" if appends == 0 else "appended")
                return _Learner(index, learner, keys, state, appends, key)
        if keys.tried:
            self.on_lookup(model.name, keys.kind, "miss" if seen is None else "stale")
        return _Learner(index, learner, keys, None, None)

    async def _update(self, model: ModelVersion, chunk: list[_Learner], run: StepCall,
                      place: GatewayPlace | HeldPlace) -> None:
        """Each learner's state brought to its history: rebuilt together, then appended step by step."""
        rebuild = [p for p in chunk if p.appends is None]
        if rebuild:
            await self._rebuild(model, rebuild, run, place)
        for step in range(max((p.appends or 0 for p in chunk), default=0)):
            moving = [p for p in chunk if p.appends is not None and p.appends > step]
            kept = await self._append(model, moving, [p.state.length - p.base for p in moving], 1, run, place)
            for p, entry in zip(moving, kept):
                p.state = _entry(model, p, p.state.length + 1, entry)

    async def _rebuild(self, model: ModelVersion, rebuild: list[_Learner], run: StepCall,
                       place: GatewayPlace | HeldPlace) -> None:
        """step_start on each learner's first W - 1 interactions (all of a window model's kept ones); a band
        model's longer history then in step_append calls of up to W - 1 interactions, learner by learner."""
        graphs, first = STEP_GRAPHS[model.step_state], max(model.window - 1, 0)
        width = max(p.encoded.skills.shape[1] for p in rebuild)
        rows = [self.encoder.history_row(_head(p.encoded, first), model.window, width) for p in rebuild]
        feeds = {spec.name: np.stack([r[j] for r in rows]) for j, spec in enumerate(graphs.start.inputs)}
        feeds.update(place.keep_feeds([slot_of(p.keys.store) for p in rebuild]))
        tensors = await run(place.graphs(graphs).start.name, feeds)
        for k, p in enumerate(rebuild):
            covered = min(p.encoded.history_used, first)
            p.state = _entry(model, p, covered, place.kept(tensors, feeds, k))
        for p in rebuild:
            while p.state.length < p.encoded.history_used:         # a band model past its band
                count = min(first, p.encoded.history_used - p.state.length)
                kept = await self._append(model, [p], [p.state.length], count, run, place)
                p.state = _entry(model, p, p.state.length + count, kept[0])

    async def _append(self, model: ModelVersion, moving: list[_Learner], positions: list[int], count: int,
                      run: StepCall, place: GatewayPlace | HeldPlace) -> list[Kept]:
        """step_append of `count` interactions of each learner from its encoded index `positions[k]` on: each
        one's new entry tensors and held key."""
        graphs = STEP_GRAPHS[model.step_state]
        width = max(p.encoded.skills.shape[1] for p in moving)
        feeds = place.state_feeds(graphs, [p.state for p in moving])
        feeds["append_question"] = np.stack([p.encoded.questions[i:i + count] for p, i in zip(moving, positions)])
        feeds["append_response"] = np.stack([p.encoded.responses[i:i + count] for p, i in zip(moving, positions)])
        feeds["append_skills"] = np.stack([self.encoder.widen(p.encoded.skills[i:i + count], width)
                                           for p, i in zip(moving, positions)])
        feeds.update(place.keep_feeds([held_slot(p.state.held) for p in moving] if place.held else []))
        tensors = await run(place.graphs(graphs).append.name, feeds)
        return [place.kept(tensors, feeds, k) for k in range(len(moving))]

    async def _next(self, model: ModelVersion, chunk: list[_Learner], run: StepCall, limit: int,
                    place: GatewayPlace | HeldPlace) -> list[np.ndarray]:
        """step_next over the chunk's learners, candidates in pieces of at most `limit`."""
        graphs = STEP_GRAPHS[model.step_state]

        pieces, owners = self.encoder.split_candidates([p.encoded for p in chunk], max(limit, 1))
        width = self.encoder.candidate_width(max(piece.n_candidates for piece in pieces))
        skills = max(piece.candidate_skills.shape[1] for piece in pieces)
        questions = np.full((len(pieces), width), PAD_ID, dtype=np.int64)
        candidate_skills = np.full((len(pieces), width, skills), PAD_ID, dtype=np.int64)
        for k, piece in enumerate(pieces):
            questions[k, :piece.n_candidates] = piece.candidate_questions
            candidate_skills[k, :piece.n_candidates, :piece.candidate_skills.shape[1]] = piece.candidate_skills
        feeds = place.state_feeds(graphs, [chunk[o].state for o in owners])
        feeds["candidate_questions"], feeds["candidate_skills"] = questions, candidate_skills
        probs = (await run(place.graphs(graphs).next.name, feeds))[graphs.next.output_names[0]]
        parts: list[list[np.ndarray]] = [[] for _ in chunk]
        for k, (piece, owner) in enumerate(zip(pieces, owners)):
            parts[owner].append(np.asarray(probs[k, :piece.n_candidates], dtype=np.float32))
        return [p[0] if len(p) == 1 else np.concatenate(p) for p in parts]


def _kept_elsewhere(state: LearnerState | None, held: bool) -> bool:
    """The entry's state is in the other place than the call's (the version's config changed since)."""
    return state is not None and (state.held is not None) != held


def _history_hash(learner: EncodedLearner, m: int) -> str:
    """A key for the learner's first `m` kept interactions (skill sets without their all-padding columns)."""
    skills = learner.skills[:m]
    used = skills.shape[1]
    while used > 1 and not skills[:, used - 1].any():            # PAD_ID is 0
        used -= 1
    digest = hashlib.blake2b(digest_size=16)
    for array in (learner.questions[:m], learner.responses[:m], skills[:, :used]):
        digest.update(np.int64(array.size).tobytes())
        digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return HISTORY + digest.hexdigest()


def _head(learner: EncodedLearner, n: int) -> EncodedLearner:
    """The learner with its first `n` history interactions only."""
    return EncodedLearner(learner.questions[:n], learner.skills[:n], learner.responses[:n],
                          learner.candidate_questions, learner.candidate_skills)


def _entry(model: ModelVersion, plan: _Learner, length: int, kept: Kept) -> LearnerState:
    """The cache entry of the learner's first `length` interactions (arrays copied: a batch's output is not
    kept alive by one learner's slice). A band model's entry keeps the last W - 1 of them and the
    fingerprint of the ones before."""
    (tensors, held), learner, base = kept, plan.encoded, plan.base
    keep = max(length - (model.window - 1), base) if model.band else base
    prior = extend(plan.prior, *(a[:keep - base] for a in (learner.questions, learner.skills, learner.responses)))
    end = length - base
    return LearnerState(np.array(learner.questions[keep - base:end]), np.array(learner.skills[keep - base:end]),
                        np.array(learner.responses[keep - base:end]), {n: np.array(t) for n, t in tensors.items()},
                        offset=keep, prior=prior, held=held)
