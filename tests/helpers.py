"""Small helpers shared by test modules (not fixtures)."""
from __future__ import annotations

import time

import pytest


def wait_for(predicate, timeout: float, what: str, step: float = 0.1):
    """Poll `predicate` until it returns a truthy value (returned) or fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")
