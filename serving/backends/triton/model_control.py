"""Triton's model-control calls as the supervisor (serving/backends/triton/supervisor.py) makes them,
with tritonserver in explicit mode: a load, an unload followed at once by a load (a reload), an unload
that waits until Triton lists no instance before the load (a config change), the wait until no version
is LOADING, one version's state, and the digest of the config.pbtxt a load would serve. It keeps no
state: the supervisor decides when, and holds the locks, the gates and the ready sets."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from tritonclient.utils import InferenceServerException

from routerkt.contract.signature import CONFIG_FILE
from serving.backends.triton.triton_client import TritonClient
from serving.pipeline.parts import BackendError
from serving.settings import Settings

log = logging.getLogger("routerkt.gateway.triton")

UNLOAD_POLL_S = 0.1        # how often an unload (or a load, before the held calls go) is checked
BUSY_STATES = ("READY", "LOADING", "UNLOADING")     # Triton states of a version whose instance still exists


class TritonModelControl:
    """Model-control calls to one Triton (`client`), bounded by settings.reload_timeout_s / probe_timeout_s."""

    def __init__(self, settings: Settings, client: TritonClient) -> None:
        self.settings = settings
        self.client = client

    async def load(self, model: str, version: int) -> bool:
        """Ask Triton to load `model` (one load brings every version of the repository); True when it did."""
        log.info("asking Triton to load model %s (version %d is in the repository)", model, version)
        try:
            await self.client.load(model, self.settings.reload_timeout_s)
            return True
        except InferenceServerException as exc:
            log.error("Triton did not load model %s: %s", model, first_line(exc.message()))
            return False

    async def unload_then_load(self, model: str) -> None:
        """Unload, then load at once. Not waiting for the unload on purpose: with a dead stub the
        version stays UNLOADING for 30-40 s (Triton waits for the stub), while a load issued right
        away brings up a fresh instance in about 1.4 s (measured with Triton 2.51)."""
        await self.client.unload(model, self.settings.reload_timeout_s)
        await self.client.load(model, self.settings.reload_timeout_s)

    async def unload_and_load(self, model: str, version: int) -> bool:
        """Unload every version, wait until Triton lists none loaded or unloading, then load. A plain
        load would tear the old instances down about a second after it returns, while calls run again
        (the crash in gates.py)."""
        deadline = time.monotonic() + self.settings.reload_timeout_s
        try:
            await self.client.unload(model, self.settings.reload_timeout_s)
            while time.monotonic() < deadline:
                states = await self.client.model_states(self.settings.probe_timeout_s) or {}
                if not any(state in BUSY_STATES for state in states.get(model, {}).values()):
                    break
                await asyncio.sleep(UNLOAD_POLL_S)
        except InferenceServerException as exc:
            log.error("Triton did not unload model %s: %s", model, first_line(str(exc)))
        except BackendError as exc:
            log.error("Triton did not unload model %s: %s", model, first_line(exc.detail))
        return await self.load(model, version)

    async def settled_states(self, model: str) -> dict[int, str]:
        """Triton's states of the model's versions once none is LOADING (or reload_timeout_s passed);
        {} while Triton does not answer."""
        deadline = time.monotonic() + self.settings.reload_timeout_s
        while True:
            try:
                states = (await self.client.model_states(self.settings.probe_timeout_s) or {}).get(model, {})
            except BackendError:
                states = {}
            if "LOADING" not in states.values() or time.monotonic() >= deadline:
                return states
            await asyncio.sleep(UNLOAD_POLL_S)

    async def version_state(self, model: str, version: int, timeout_s: float) -> str | None:
        """Triton's state of the version ("READY", "LOADING", "UNAVAILABLE", ...; "" when Triton does not
        list it), or None when Triton does not answer."""
        try:
            states = await self.client.model_states(timeout_s)
        except BackendError:
            return None
        return None if states is None else states.get(model, {}).get(version, "")

    def config_digest(self, model: str) -> str | None:
        """sha256 of the model's config.pbtxt in the repository (None: unreadable)."""
        try:
            return hashlib.sha256((self.settings.repository / model / CONFIG_FILE).read_bytes()).hexdigest()
        except OSError:
            return None


def first_line(text: str | None) -> str:
    """The first line of an error text, at most 300 characters ('' for none)."""
    return (text or "").strip().splitlines()[0][:300] if text and text.strip() else ""
