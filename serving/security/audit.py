"""The audit log (logger "routerkt.audit"): one line per ForgetLearner and per rollout change made
through the gateway, with the caller's key id (guard.CALLER), the time and what was done; never a
secret, never a raw learner id (only the first 12 hex digits of its keyed hash)."""
from __future__ import annotations

import json
import logging
import time

from serving.security.guard import CALLER

log = logging.getLogger("routerkt.audit")
LEARNER_PREFIX = 12


def audit(action: str, **what: object) -> None:
    """Log `action` by the current caller; `what`: JSON-serialisable facts (no learner ids)."""
    entry = {"action": action, "key_id": CALLER.get(),
             "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **what}
    log.info("audit %s", json.dumps(entry, sort_keys=True))
