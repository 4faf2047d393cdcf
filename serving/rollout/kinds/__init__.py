"""Rollout kinds, one strategy class per file; KINDS is the one table that names them. A new kind
is a new file here (a Rollout subclass) plus its line below and its tests."""
from __future__ import annotations

from serving.rollout.kinds.base import Rollout
from serving.rollout.kinds.canary import Canary
from serving.rollout.kinds.latest import Latest
from serving.rollout.kinds.pinned import Pinned
from serving.rollout.kinds.shadow import Shadow

KINDS: dict[str, type[Rollout]] = {kind.name: kind for kind in (Latest, Pinned, Canary, Shadow)}
