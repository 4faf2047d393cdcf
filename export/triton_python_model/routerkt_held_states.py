"""The learner states a Triton python model (model.py, beside this file in every version folder) keeps for the
gateway: the held calls of routerkt/contract/step_signature.py. Imports only the standard library and numpy."""
from collections import OrderedDict

import numpy as np

STATE_LENGTH = "state_length"                    # mirrors routerkt/contract/step_signature.py
HELD_METRICS = (("routerkt_triton_held_states", "learner states this model instance holds for the gateway"),
                ("routerkt_triton_held_state_bytes", "bytes of the learner states this model instance holds"))


class HeldStates:
    """The learner states this instance keeps (key -> the state tensors, each [1, ...]), at most `budget`
    bytes, least recently used out first. A key is the caller's and never reused for another state, so a
    key kept twice is a clash of two callers' keys: neither is kept (both then rebuild)."""

    def __init__(self, budget):
        self.budget = budget
        self.states = OrderedDict()
        self.nbytes = 0

    def gather(self, refs, lengths):
        """The states under `refs` as one batch, or None when one is not kept or has another length."""
        if len(refs) != len(lengths):
            return None
        rows = []
        for ref, length in zip(refs.tolist(), lengths.tolist()):
            state = self.states.get(ref)
            if state is None or int(state[STATE_LENGTH][0]) != length:
                return None
            self.states.move_to_end(ref)
            rows.append(state)
        return {n: rows[0][n] if len(rows) == 1 else np.concatenate([r[n] for r in rows]) for n in rows[0]}

    def keep(self, keys, outputs, offset):
        """Keep row offset + k of every state tensor in `outputs` under keys[k]."""
        for k, key in enumerate(keys.tolist()):
            state = {n: np.array(o[offset + k:offset + k + 1]) for n, o in outputs.items()}
            size = sum(a.nbytes for a in state.values())
            if key in self.states or size > self.budget:
                self.drop(key)
                continue
            self.states[key] = state
            self.nbytes += size
            while self.nbytes > self.budget:
                self.drop(next(iter(self.states)))

    def release(self, refs):
        """Replaced states go first when room is needed; a call that read one before it was replaced still
        finds it meanwhile (the gateway's Predict beside Observe's fill)."""
        for ref in refs.tolist():
            if ref in self.states:
                self.states.move_to_end(ref, last=False)

    def drop(self, key):
        """Delete the state under `key`: its length, or -1 when none was held."""
        state = self.states.pop(key, None)
        if state is None:
            return -1
        self.nbytes -= sum(a.nbytes for a in state.values())
        return int(state[STATE_LENGTH][0])


def held_gauges(pb_utils, model_name, version):
    """[families, states gauge, bytes gauge] of the held states (HELD_METRICS); [] without the metrics API.
    The family must stay referenced as long as its gauges: dropping it unregisters them."""
    family_cls = getattr(pb_utils, "MetricFamily", None)
    if family_cls is None or not hasattr(family_cls, "GAUGE"):
        return []
    try:
        families = [family_cls(name=name, description=text, kind=family_cls.GAUGE) for name, text in HELD_METRICS]
        labels = {"model": model_name, "version": str(version)}
        return [families, *(family.Metric(labels=labels) for family in families)]
    except Exception:                              # metrics disabled or API mismatch: serve anyway
        return []
