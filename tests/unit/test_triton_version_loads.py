"""Loads of a model whose config serves every version folder (`version_policy: all`), against a
fake Triton that knows several versions: a config-changing load lets its held calls go only once
Triton lists the versions READY and each answered a probe; an inference that meets a version not
READY is repeated once and never marks Triton down; a probe round loads when any repository version
is not loaded; `ensure_loaded` loads one version at once and waits for it."""
from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from routerkt.contract.signature import CONFIG_FILE
from serving.backends.triton import backend as backend_module
from serving.backends.triton import supervisor as supervisor_module
from serving.core.catalog import ModelVersion
from serving.pipeline.parts import BackendError, FailureKind
from tests.helpers import triton_answer, triton_rpc_error
from tests.unit.test_serving_triton_supervisor import TABLE, FakeClient, make_backend, reloads, settle

pytestmark = pytest.mark.unit

CALL_ROWS = 2          # the test's calls send 2 rows; probes send 1


def table(*versions: int) -> dict[str, dict[int, ModelVersion]]:
    one = TABLE["kt"][1]
    return {"kt": {v: ModelVersion(name="kt", version=v, window=one.window, max_batch_size=8, vocab=one.vocab)
                   for v in versions}}


def feeds() -> dict[str, np.ndarray]:
    rows = np.zeros((CALL_ROWS, 4), dtype=np.int64)
    return {"questions": rows, "skills": rows[..., None], "responses": rows}


class VersionsTriton(FakeClient):
    """A Triton with several versions of model "kt". `events` records control calls, probes
    ("probe N"), calls ("call N") and when a load's versions became READY ("ready")."""

    def __init__(self, states: dict[int, str]) -> None:
        super().__init__()
        self.states = dict(states)
        self.events: list[str] = []
        self.after_load: dict[int, str] = {}     # the states a load leaves (default: every version READY)
        self.loading_s = 0.0                     # after load returns, its versions stay LOADING this long
        self.refuse = False                      # the load fails
        self.not_ready_once: set[int] = set()    # versions whose next inference answers "not at ready state"

    async def get_model_repository_index(self, client_timeout=None):
        return SimpleNamespace(models=[SimpleNamespace(name="kt", version=str(v), state=s)
                                       for v, s in sorted(self.states.items())])

    async def ModelInfer(self, request, timeout=None):  # noqa: N802 - the stub's method name
        version = int(request.model_version)
        kind = "call" if request.inputs[0].shape[0] == CALL_ROWS else "probe"
        self.events.append(f"{kind} {version}")
        if self.states.get(version) != "READY" or version in self.not_ready_once:
            self.not_ready_once.discard(version)
            raise triton_rpc_error("UNAVAILABLE", f"Request for unknown model: 'kt' version {version} "
                                                  f"is not at ready state")
        return triton_answer(request)

    async def unload_model(self, model, client_timeout=None):
        self.events.append("unload")
        self.unloads += 1
        self.states = {v: "UNAVAILABLE" for v in self.states}

    async def load_model(self, model, client_timeout=None):
        self.events.append("load")
        await asyncio.sleep(self.load_delay)
        self.loads += 1
        if self.refuse:
            raise InferenceServerException(msg="failed to load 'kt'", status="StatusCode.INVALID_ARGUMENT")
        after = self.after_load or {v: "READY" for v in self.states}
        if self.loading_s:
            self.states = {v: "LOADING" if s == "READY" else s for v, s in after.items()}
            asyncio.get_running_loop().call_later(self.loading_s, self._loaded, after)
        else:
            self.states = dict(after)

    def _loaded(self, after: dict[int, str]) -> None:
        self.events.append("ready")
        self.states = dict(after)


def install(backend, triton: VersionsTriton) -> None:
    backend.client._client = backend.client._infer_stub = triton


@contextlib.asynccontextmanager
async def serving(states: dict[int, str], repository=None, asked: tuple[int, ...] = ()):
    """(backend, triton, metrics): a backend over a VersionsTriton in `states` (and over `repository`,
    given, holding kt's config.pbtxt and a folder per version of `states`), after one probe round over
    the versions of `states` (the ones in `asked` count as asked for a load a moment ago: no load from
    the round). On exit its background loads settle and its supervisor closes."""
    if repository is not None:
        write_config(repository, versions=tuple(states))
    backend, _, metrics = make_backend(**({"repository": repository} if repository is not None else {}))
    triton = VersionsTriton(states)
    install(backend, triton)
    for version in asked:
        backend.supervisor._load_attempts[("kt", version)] = time.monotonic()
    await backend.supervisor.probe(table(*states))
    try:
        yield backend, triton, metrics
    finally:
        await settle(backend)
        await backend.supervisor.close()


def publish_changed(repo, triton: VersionsTriton, version: int) -> None:
    """Version `version` appears with another config.pbtxt; Triton does not serve it yet."""
    write_config(repo, CHANGED, versions=(version,))
    triton.states[version] = "UNAVAILABLE"


def write_config(repo, text: str = 'name: "kt"\n', versions=(1,)) -> None:
    (repo / "kt").mkdir(exist_ok=True)
    (repo / "kt" / CONFIG_FILE).write_text(text)
    for version in versions:
        (repo / "kt" / str(version)).mkdir(exist_ok=True)


CHANGED = 'name: "kt"\nparameters { key: "x" value { string_value: "y" } }\n'


# -- a config-changing load: held calls go once the versions are READY and answered a probe -----------
def test_held_calls_go_only_after_the_reloaded_versions_are_ready_and_probed(tmp_path) -> None:
    async def scenario():
        async with serving({1: "READY"}, tmp_path) as (backend, triton, metrics):
            assert backend.ready_versions("kt") == {1}
            publish_changed(tmp_path, triton, 2)
            triton.load_delay, triton.loading_s = 0.05, 0.3               # load returns; Triton still brings them up
            triton.events.clear()
            await backend.supervisor.probe(table(1, 2))                   # 2 not loaded: the held, unload-first load
            await asyncio.sleep(0.01)
            assert backend.supervisor.gates.is_closed("kt")
            call = asyncio.create_task(backend.infer(table(1, 2)["kt"][1], feeds(), 5.0))
            await asyncio.sleep(0.15)
            assert not call.done() and backend.supervisor.gates.is_closed("kt")   # load returned, still LOADING
            assert (await call).shape == (CALL_ROWS, 4)
            held = triton.events[triton.events.index("unload"):]          # (the round probed version 1 first)
            assert held == ["unload", "load", "ready", "probe 1", "probe 2", "call 1"]
            assert backend.ready_versions("kt") == {1, 2} and backend.supervisor.triton_ready
            assert reloads(metrics, "config_changed") == 1
    asyncio.run(scenario())


def test_a_version_the_load_left_out_is_not_ready_and_triton_is_not_marked_down(tmp_path) -> None:
    """The second night under the old `latest: 2` policy: versions 2 and 3 come back, 1 does not.
    The held call for version 1 fails as NOT_LOADED (version 1 only), never as "Triton unreachable"."""
    async def scenario():
        async with serving({1: "READY", 2: "READY"}, tmp_path) as (backend, triton, _):
            publish_changed(tmp_path, triton, 3)
            triton.after_load = {1: "UNAVAILABLE", 2: "READY", 3: "READY"}
            triton.load_delay = 0.1
            await backend.supervisor.probe(table(1, 2, 3))
            await asyncio.sleep(0.01)
            with pytest.raises(BackendError) as info:
                await backend.infer(table(1, 2, 3)["kt"][1], feeds(), 5.0)
            assert info.value.kind is FailureKind.NOT_LOADED
            assert triton.events.count("call 1") == 2                     # repeated once
            assert backend.supervisor.triton_ready and backend.ready_versions("kt") == {2, 3}
    asyncio.run(scenario())


def test_a_probe_round_that_read_triton_before_the_load_does_not_overwrite_its_ready_set(tmp_path) -> None:
    async def scenario():
        async with serving({1: "READY"}, tmp_path) as (backend, triton, _):
            supervisor = backend.supervisor
            stale = supervisor._epochs.get("kt", 0)
            publish_changed(tmp_path, triton, 2)
            await supervisor.probe(table(1, 2))
            await settle(backend)
            assert backend.ready_versions("kt") == {1, 2}
            # states read while the model was unloaded, handled after the load: ignored
            await supervisor._probe_model("kt", table(1, 2)["kt"], {1: "UNAVAILABLE", 2: "LOADING"}, stale)
            assert backend.ready_versions("kt") == {1, 2}
    asyncio.run(scenario())


# -- the request path: one repeat ----------------------------------------------------------------------
def test_an_inference_meeting_a_version_not_ready_is_repeated_once_and_answers() -> None:
    async def scenario():
        async with serving({1: "READY"}) as (backend, triton, _):
            triton.events.clear()
            triton.not_ready_once = {1}
            probs = await backend.infer(table(1)["kt"][1], feeds(), 1.0)
            assert probs.shape == (CALL_ROWS, 4) and triton.events == ["call 1", "call 1"]
            assert backend.ready_versions("kt") == {1} and backend.supervisor.triton_ready
    asyncio.run(scenario())


def test_no_repeat_without_time_for_it_and_none_for_other_failures() -> None:
    async def scenario():
        async with serving({1: "READY"}) as (backend, triton, _):
            triton.events.clear()
            triton.not_ready_once = {1}
            short = backend_module.RETRY_PAUSE_S + backend_module.MIN_RETRY_S / 2
            with pytest.raises(BackendError) as info:
                await backend.infer(table(1)["kt"][1], feeds(), short)
            assert info.value.kind is FailureKind.NOT_LOADED and triton.events == ["call 1"]
            assert backend.ready_versions("kt") == frozenset()            # that version only, reported at once
            assert backend.supervisor.triton_ready
            client = FakeClient()
            backend.client._infer_stub = client
            client.infer_error = InferenceServerException(msg="model execution failed", status="StatusCode.INTERNAL")
            with pytest.raises(BackendError) as info:
                await backend.infer(table(1)["kt"][1], feeds(), 1.0)
            assert info.value.kind is FailureKind.FAILED
    asyncio.run(scenario())


# -- probe rounds load when any repository version is not loaded ----------------------------------------
def test_a_probe_round_loads_when_any_version_is_not_loaded_once_per_retry_period(tmp_path) -> None:
    async def scenario():
        states = {1: "UNAVAILABLE", 2: "READY", 3: "READY"}              # an older version, not the latest
        async with serving(states, tmp_path) as (backend, triton, _):
            triton.after_load = dict(states)                                     # Triton does not bring it back
            await settle(backend)
            assert triton.loads == 1 and backend.ready_versions("kt") == {2, 3}
            await backend.supervisor.probe(table(1, 2, 3))
            await settle(backend)
            assert triton.loads == 1                                              # LOAD_RETRY_S per version
            triton.states[4] = ""                                                 # a new version folder
            triton.after_load = {**triton.states, 4: "READY"}
            await backend.supervisor.probe(table(1, 2, 3, 4))
            await settle(backend)
            assert triton.loads == 2
            await backend.supervisor.probe(table(1, 2, 3, 4))
            assert backend.ready_versions("kt") == {2, 3, 4}
            triton.states[5] = "LOADING"                                          # Triton is at it already
            await backend.supervisor.probe(table(1, 2, 3, 4, 5))
            await settle(backend)
            assert triton.loads == 2
    asyncio.run(scenario())


# -- ensure_loaded ----------------------------------------------------------------------------------------
def test_ensure_loaded_loads_a_repository_version_at_once_and_waits_for_its_probe(tmp_path) -> None:
    async def scenario():
        async with serving({1: "READY", 2: "UNAVAILABLE"}, tmp_path, asked=(2,)) as (backend, triton, _):
            supervisor = backend.supervisor
            await settle(backend)
            assert triton.loads == 0 and backend.ready_versions("kt") == {1}    # the round waits LOAD_RETRY_S
            triton.events.clear()
            triton.loading_s = 0.2
            started = time.monotonic()
            assert await supervisor.ensure_loaded("kt", 2, timeout_s=5.0) is True
            assert time.monotonic() - started < 2.0
            assert triton.loads == 1 and backend.ready_versions("kt") == {1, 2}
            assert triton.events[:2] == ["load", "ready"] and "probe 2" in triton.events
            events = len(triton.events)
            assert await supervisor.ensure_loaded("kt", 2, timeout_s=5.0) is True    # ready: nothing asked
            assert len(triton.events) == events and triton.loads == 1
            await supervisor.probe(table(1, 2))                                   # a later round keeps it
            assert backend.ready_versions("kt") == {1, 2}
    asyncio.run(scenario())


def test_ensure_loaded_is_false_without_the_folder_on_a_refused_load_and_after_its_timeout(tmp_path) -> None:
    async def scenario():
        async with serving({1: "READY", 2: "UNAVAILABLE"}, tmp_path, asked=(2,)) as (backend, triton, _):
            supervisor = backend.supervisor
            assert await supervisor.ensure_loaded("kt", 7, timeout_s=1.0) is False      # no folder 7
            assert triton.loads == 0
            triton.refuse = True
            started = time.monotonic()
            assert await supervisor.ensure_loaded("kt", 2, timeout_s=5.0) is False
            assert time.monotonic() - started < 1.0 and triton.loads == 1
            triton.refuse, triton.load_delay = False, 1.0
            supervisor._load_attempts.clear()
            started = time.monotonic()
            assert await supervisor.ensure_loaded("kt", 2, timeout_s=0.3) is False
            assert 0.3 <= time.monotonic() - started < 0.8
    asyncio.run(scenario())


def test_ensure_loaded_waits_for_a_running_load_instead_of_loading_again(tmp_path) -> None:
    async def scenario():
        async with serving({1: "READY"}, tmp_path) as (backend, triton, _):
            supervisor = backend.supervisor
            publish_changed(tmp_path, triton, 2)
            triton.load_delay = 0.2
            await supervisor.probe(table(1, 2))                                    # the held load starts
            await asyncio.sleep(0.01)
            assert supervisor.gates.is_closed("kt")
            assert await supervisor.ensure_loaded("kt", 2, timeout_s=5.0) is True
            assert triton.loads == 1 and backend.ready_versions("kt") == {1, 2}
    asyncio.run(scenario())


def test_the_module_constants_keep_their_meaning() -> None:
    assert supervisor_module.NO_LOAD_NEEDED == ("READY", "LOADING")
    assert FailureKind.NOT_LOADED in backend_module.RETRIED and FailureKind.DEADLINE not in backend_module.RETRIED
