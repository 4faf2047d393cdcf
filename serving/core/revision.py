"""Revision: where a learner's stored event log stands, so a cached learner state is checked with one small read."""
from __future__ import annotations

import secrets
from dataclasses import dataclass

BASE_BITS = 32           # a learner's first sequence number: a random multiple of 2**20 below 2**52 (exact in Lua)
STEP_BITS = 20


def new_base() -> int:
    """The first sequence number of a learner's log: random, so that a learner forgotten (or expired) and
    observed again never shows the revision an old cached state was computed at."""
    return secrets.randbelow(1 << BASE_BITS) << STEP_BITS


@dataclass(frozen=True)
class Revision:
    """A learner's log: `next` is the sequence number its next event gets (every append adds its events'
    count), `first` the sequence number of its oldest event still kept (retention trims from the front)."""

    first: int
    next: int

    @property
    def kept(self) -> int:
        return self.next - self.first

    def appended_since(self, before: Revision) -> int | None:
        """Events appended after `before`, nothing removed from the front since; None when this log does not
        continue `before` (trimmed by retention, forgotten and observed again, another learner)."""
        if self.first != before.first or self.next < before.next:
            return None
        return self.next - before.next
