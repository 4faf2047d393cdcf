"""serving/backends/triton/gates.py and the supervisor's config-changing load: calls are counted per
model; a closed gate holds new calls (up to their deadline) and waits for those in flight; a load
whose config.pbtxt changed unloads first with the model's calls held, a load with the served config
runs beside them."""
from __future__ import annotations

import asyncio

import pytest

from routerkt.contract.signature import CONFIG_FILE
from serving.backends.triton.gates import ModelGates
from serving.core.catalog import ModelVersion
from serving.pipeline.parts import BackendError, FailureKind
from tests.unit.test_serving_triton_supervisor import TABLE, FakeClient, make_backend, reloads, settle

pytestmark = pytest.mark.unit


def test_a_closed_gate_waits_for_calls_in_flight_and_holds_new_ones() -> None:
    async def scenario():
        gates, events = ModelGates(), []

        async def call(name: str, hold: float) -> None:
            async with gates.admitted("kt", timeout_s=2.0) as left:
                assert 0 < left <= 2.0
                events.append(f"{name} in")
                await asyncio.sleep(hold)
                events.append(f"{name} out")

        first = asyncio.create_task(call("first", 0.2))
        await asyncio.sleep(0.05)
        assert gates.inflight("kt") == 1 and not gates.is_closed("kt")
        async with gates.closed("kt", timeout_s=2.0) as still:
            assert still == 0 and events == ["first in", "first out"]        # drained before the body
            second = asyncio.create_task(call("second", 0.0))
            await asyncio.sleep(0.1)
            assert gates.is_closed("kt") and events == ["first in", "first out"]   # held
            events.append("load")
        await asyncio.gather(first, second)
        assert events == ["first in", "first out", "load", "second in", "second out"]
        assert gates.inflight("kt") == 0 and not gates.is_closed("kt")
        async with gates.admitted("other", 1.0):                           # other models never wait
            pass
    asyncio.run(scenario())


def test_a_call_held_past_its_deadline_fails_as_deadline() -> None:
    async def scenario():
        gates = ModelGates()
        async with gates.closed("kt", timeout_s=1.0):
            with pytest.raises(BackendError) as info:
                async with gates.admitted("kt", timeout_s=0.1):
                    pass
        assert info.value.kind is FailureKind.DEADLINE and gates.inflight("kt") == 0
    asyncio.run(scenario())


def test_the_drain_gives_up_after_its_timeout_and_reports_the_calls_left() -> None:
    async def scenario():
        gates = ModelGates()
        entered = asyncio.Event()

        async def stuck() -> None:
            async with gates.admitted("kt", 5.0):
                entered.set()
                await asyncio.sleep(0.5)
        task = asyncio.create_task(stuck())
        await entered.wait()
        async with gates.closed("kt", timeout_s=0.05) as still:
            assert still == 1
        await task
    asyncio.run(scenario())


class OrderedClient(FakeClient):
    """FakeClient that serves version 1 only and records control calls in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def unload_model(self, model, client_timeout=None):
        self.calls.append("unload")
        await super().unload_model(model, client_timeout)

    async def load_model(self, model, client_timeout=None):
        self.calls.append("load")
        await super().load_model(model, client_timeout)


@pytest.mark.parametrize("changed", [False, True], ids=["same-config", "changed-config"])
def test_a_config_changing_load_unloads_first_with_calls_held(tmp_path, changed) -> None:
    (tmp_path / "kt").mkdir()
    config = tmp_path / "kt" / CONFIG_FILE
    config.write_text('name: "kt"\n')

    async def scenario():
        backend, _, metrics = make_backend(repository=tmp_path)
        client = OrderedClient()
        backend.client._client = backend.client._infer_stub = client
        await backend.supervisor.probe(TABLE)                      # version 1 answers: its config is recorded
        assert backend.ready_versions("kt") == {1}
        if changed:
            config.write_text('name: "kt"\nparameters { key: "x" value { string_value: "y" } }\n')
        table = {"kt": {**TABLE["kt"], 2: ModelVersion(name="kt", version=2, window=4, max_batch_size=8,
                                                       vocab=TABLE["kt"][1].vocab)}}
        client.load_delay = 0.2
        await backend.supervisor.probe(table)                      # latest (2) not loaded: load it
        await asyncio.sleep(0.05)
        assert backend.supervisor.gates.is_closed("kt") is changed
        await settle(backend)
        assert client.calls == (["unload", "load"] if changed else ["load"])
        assert reloads(metrics, "config_changed") == (1.0 if changed else 0.0)
        assert not backend.supervisor.gates.is_closed("kt")
        await backend.supervisor.close()
    asyncio.run(scenario())
