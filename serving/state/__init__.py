"""The learner-state path (issue 50): cached step-graph states answer Predict by learner_id.

- cache.py           StateCache: (model, version, learner key) -> LearnerState, LRU within a byte budget
- learner_states.py  LearnerStates: hit / appended / miss / stale, the step graphs through the backend;
                     `observed`: Observe's fill (run by serving/pipeline/state_fill.py); a learner named by
                     learner_id is keyed by the hash its history source computed (LearnerInput.learner_key)
- fingerprint.py     a 64-bit fingerprint of a history that extends without it (band entries)

`learner_states(settings, metrics, encoder)` builds the path create_server injects into the pipeline
(settings.state_cache_mb > 0, and a session store or settings.prefix_cache); it answers only versions
exported with `--step-graphs` on a backend whose `steps()` says it runs them.
"""
from __future__ import annotations

from serving.core.encoded import StepFeeds
from serving.metrics import Metrics, labelled
from serving.settings import Settings
from serving.state.cache import StateCache
from serving.state.learner_states import LearnerStates

MIB = 1 << 20


def learner_states(settings: Settings, metrics: Metrics, encoder: StepFeeds) -> LearnerStates:
    """The path over a cache of settings.state_cache_mb MiB, counted in the routerkt_state_* metrics."""

    def sized(learners: int, nbytes: int) -> None:
        metrics.state_cache_learners.set(learners)
        metrics.state_cache_bytes.set(nbytes)

    cache = StateCache(int(settings.state_cache_mb * MIB),
                       on_evict=lambda model, count: metrics.state_evictions.labels(model=model).inc(count),
                       on_size=sized)
    lookups = labelled(metrics.state_lookups)
    return LearnerStates(cache, encoder, on_lookup=lambda model, kind, result: lookups(
        model=model, key=kind, result=result).inc())
