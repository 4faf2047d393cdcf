"""Admission by cost and deadline: what a Predict / PredictBatch / Recommend call may cost, and
whether it can still be answered in time.

Cost unit: a call costs, per learner, (the model's window + its candidates) rows — what the rank
graph computes for it. `check_budget` refuses a call over settings.max_call_rows with
INVALID_ARGUMENT (field `learners` or `candidates`: split the call), before any work is done.

Deadline-aware shedding: `ServiceTime` keeps an exponentially weighted average of the seconds per
row of the calls that ended recently (answered, or out of time: queueing included, so it rises
with the load). While at least settings.shed_min_inflight calls are in flight, a call whose
remaining deadline is shorter than HEADROOM x its expected service time (rows x seconds per row)
is refused at once with RESOURCE_EXHAUSTED:
it would most likely miss its deadline after taking Triton time from calls that can still make
theirs. With fewer calls in flight every call is admitted, so the estimate follows the load down.
Off by default (shed_min_inflight = 0): on this 2-core machine it did not raise goodput at 4x
overload (docs/benchmarks.md, "Overload"), because refusing calls costs the CPU that admitted calls need.
What did raise it is the queue in front of the in-flight slots (serving/pipeline/prediction.py `_acquire`):
a call waits for a slot only while its deadline still covers `expected_call()` after the wait.
"""
from __future__ import annotations

from serving import status_errors as errors
from serving.core.catalog import ModelVersion
from serving.settings import Settings
from serving.core.validation import LearnerInput

SMOOTHING = 0.2            # weight of the newest call in the average
HEADROOM = 1.5             # a call is admitted when its deadline leaves this many times its expected time


def call_rows(learners: list[LearnerInput], model: ModelVersion) -> int:
    return sum(model.window + learner.n_candidates for learner in learners)


def check_budget(rows: int, settings: Settings, batch: bool) -> None:
    if rows > settings.max_call_rows:
        raise errors.invalid_argument("learners" if batch else "candidates",
                                      f"this call costs {rows} rows (learners x (window + candidates)); at most "
                                      f"{settings.max_call_rows} per call: split it")


class ServiceTime:
    """Seconds per row of recently answered calls (see the module docstring)."""

    def __init__(self) -> None:
        self.per_row: float | None = None
        self.per_call: float | None = None     # seconds of a call, whatever its size (for queueing)

    def add(self, rows: int, seconds: float) -> None:
        if rows <= 0:
            return
        self.per_row = _smoothed(self.per_row, seconds / rows)
        self.per_call = _smoothed(self.per_call, seconds)

    def expected(self, rows: int) -> float:
        return 0.0 if self.per_row is None else self.per_row * rows

    def expected_call(self) -> float:
        return self.per_call or 0.0

    def admit(self, rows: int, remaining_s: float, inflight: int, settings: Settings) -> None:
        """Raise RESOURCE_EXHAUSTED when the call cannot be answered within `remaining_s`."""
        if settings.shed_min_inflight <= 0 or inflight < settings.shed_min_inflight:
            return
        expected = self.expected(rows)
        if expected * HEADROOM > remaining_s:
            raise errors.resource_exhausted(
                f"the gateway is overloaded: this call would take about {expected * 1000:.0f} ms, its deadline "
                f"leaves {max(remaining_s, 0) * 1000:.0f} ms; retry with backoff")


def _smoothed(average: float | None, sample: float) -> float:
    return sample if average is None else (1 - SMOOTHING) * average + SMOOTHING * sample
