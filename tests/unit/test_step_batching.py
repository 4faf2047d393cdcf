"""StepBatcher: step calls gathered together share one backend call, each caller gets its own rows
back; a lone call goes at once, others wait at most gather_s, a full batch goes; calls of other shapes go apart;
a failure reaches every member (one of alone_after: each member goes again alone)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serving.pipeline.step_batching import StepBatcher

pytestmark = pytest.mark.unit


class Backend:
    """Doubles every row; remembers each call's batch size."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.fail = fail

    async def send(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches.append(int(feeds["x"].shape[0]))
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("backend down")
        return {"y": feeds["x"] * 2, "z": feeds["x"][:, :1] + 1}


def rows(k: int, n: int = 1, width: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.arange(n * width, dtype=np.float32).reshape(n, width) + 100 * k}


def test_calls_in_one_turn_share_one_backend_call_and_get_their_rows() -> None:
    seen: list[tuple[tuple, int]] = []
    backend = Backend()
    batcher = StepBatcher(max_rows=64, on_batch=lambda key, calls: seen.append((key, calls)))

    async def main():
        return await asyncio.gather(*(batcher.run(("m", 1, "step_next"), rows(k, n=1 + k % 2), backend.send, 5.0)
                                      for k in range(5)))
    outputs = asyncio.run(main())
    assert backend.batches == [7] and seen == [(("m", 1, "step_next"), 5)]
    for k, out in enumerate(outputs):
        expected = rows(k, n=1 + k % 2)["x"]
        assert np.array_equal(out["y"], expected * 2) and np.array_equal(out["z"], expected[:, :1] + 1)


def test_other_shapes_and_full_batches_go_apart() -> None:
    backend, batcher = Backend(), StepBatcher(max_rows=2)

    async def main():
        calls = [batcher.run(("m", 1, "step_next"), rows(k), backend.send, 5.0) for k in range(3)]
        calls.append(batcher.run(("m", 1, "step_next"), rows(9, width=4), backend.send, 5.0))
        calls.append(batcher.run(("m", 2, "step_next"), rows(8), backend.send, 5.0))
        return await asyncio.gather(*calls)
    outputs = asyncio.run(main())
    assert sorted(backend.batches) == [1, 1, 1, 2]
    assert np.array_equal(outputs[3]["y"], rows(9, width=4)["x"] * 2)


def test_a_failure_reaches_every_member() -> None:
    backend, batcher = Backend(fail=True), StepBatcher(max_rows=64)

    async def main():
        return await asyncio.gather(*(batcher.run(("m", 1, "g"), rows(k), backend.send, 5.0) for k in range(3)),
                                    return_exceptions=True)
    outputs = asyncio.run(main())
    assert backend.batches == [3] and all(isinstance(o, RuntimeError) for o in outputs)


def test_a_lone_call_never_waits() -> None:
    """The gateway serves this call only and the last batch was lone: sent at the loop's next turn."""
    backend = Backend()
    batcher = StepBatcher(max_rows=64, gather_s=30.0, inflight=lambda: 1)

    async def main():
        loop = asyncio.get_running_loop()
        started = loop.time()
        outputs = [await batcher.run(("m", 1, "g"), rows(k), backend.send, 60.0) for k in range(3)]
        return outputs, loop.time() - started
    outputs, took = asyncio.run(main())
    assert backend.batches == [1, 1, 1] and took < 5.0
    assert np.array_equal(outputs[2]["y"], rows(2)["x"] * 2)


def test_with_other_calls_in_flight_a_batch_waits_gather_s_for_more() -> None:
    backend, inflight = Backend(), [1]
    batcher = StepBatcher(max_rows=64, gather_s=0.05, inflight=lambda: inflight[0])

    async def main():
        loop = asyncio.get_running_loop()
        inflight[0] = 3
        started = loop.time()
        first = asyncio.ensure_future(batcher.run(("m", 1, "g"), rows(0), backend.send, 60.0))
        await asyncio.sleep(0.01)                       # a later call, still within the first one's gather_s
        second = await batcher.run(("m", 1, "g"), rows(1), backend.send, 60.0)
        return [await first, second], loop.time() - started
    outputs, took = asyncio.run(main())
    assert backend.batches == [2] and 0.04 <= took < 5.0
    assert np.array_equal(outputs[1]["y"], rows(1)["x"] * 2)


def test_a_full_batch_goes_at_once() -> None:
    backend = Backend()
    batcher = StepBatcher(max_rows=2, gather_s=30.0, inflight=lambda: 10)

    async def main():
        calls = [asyncio.ensure_future(batcher.run(("m", 1, "g"), rows(k), backend.send, 60.0)) for k in range(3)]
        await asyncio.sleep(0.05)
        sent = backend.batches[:]
        for call in calls:                      # the third one's batch would gather for 30 s
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        return sent
    assert asyncio.run(main()) == [2]           # the third call opened a new batch, still gathering


class Lost(Exception):
    pass


def test_after_a_member_failure_every_member_goes_again_alone() -> None:
    """A merged call failing with one of alone_after (a state one member's key lost) is sent again member by
    member: only that member fails, the others get their rows."""
    batches: list[int] = []

    async def send(feeds):
        batches.append(int(feeds["x"].shape[0]))
        if (feeds["x"][:, 0] == 100).any():                 # member 1's rows
            raise Lost("state not held")
        return {"y": feeds["x"] * 2}
    batcher = StepBatcher(max_rows=64, alone_after=(Lost,))

    async def main():
        return await asyncio.gather(*(batcher.run(("m", 1, "g"), rows(k), send, 5.0) for k in range(3)),
                                    return_exceptions=True)
    outputs = asyncio.run(main())
    assert batches == [3, 1, 1, 1]
    assert isinstance(outputs[1], Lost)
    assert np.array_equal(outputs[0]["y"], rows(0)["x"] * 2) and np.array_equal(outputs[2]["y"], rows(2)["x"] * 2)


def test_a_member_cancelled_while_its_batch_runs_leaves_the_others_their_rows() -> None:
    started, release, sent = asyncio.Event(), asyncio.Event(), []

    async def slow(feeds):
        sent.append(int(feeds["x"].shape[0]))
        started.set()
        await release.wait()
        return {"y": feeds["x"] * 2}
    batcher = StepBatcher(max_rows=2, gather_s=30.0, inflight=lambda: 10)

    async def main():
        gone, kept = (asyncio.ensure_future(batcher.run(("m", 1, "g"), rows(k), slow, 60.0)) for k in range(2))
        await started.wait()
        gone.cancel()                           # its caller's deadline, while the shared call runs
        await asyncio.sleep(0)
        release.set()
        return await kept, await asyncio.gather(gone, return_exceptions=True)
    kept, (gone,) = asyncio.run(main())
    assert sent == [2] and isinstance(gone, asyncio.CancelledError)
    assert np.array_equal(kept["y"], rows(1)["x"] * 2)


def test_calls_go_alone_again_only_after_lone_after_lone_batches_in_a_row() -> None:
    """One gathered batch that found no company does not make the next calls go at once: lone_after do."""
    backend, inflight = Backend(), [3]
    batcher = StepBatcher(max_rows=64, gather_s=0.5, inflight=lambda: inflight[0], lone_after=3, probe_every_s=60.0)

    async def main():
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(batcher.run(("m", 1, "g"), rows(0), backend.send, 60.0))
        await asyncio.sleep(0.01)
        await batcher.run(("m", 1, "g"), rows(1), backend.send, 60.0)
        await first                             # a batch of two: lone calls gather again
        inflight[0] = 1
        took = []
        for k in range(4):
            started = loop.time()
            await batcher.run(("m", 1, "g"), rows(k), backend.send, 60.0)
            took.append(loop.time() - started)
        return took
    took = asyncio.run(main())
    assert backend.batches == [2, 1, 1, 1, 1]
    assert all(t >= 0.45 for t in took[:3]) and took[3] < 0.25, took


def test_a_probe_gathers_where_lone_batches_would_go_on_alone() -> None:
    """inflight() counts only calls that reached the pipeline: after a lone batch, two calls arriving together
    would each go alone at once; a probe (at most every probe_every_s) gathers them, and its size is reported."""
    backend, seen = Backend(), []
    batcher = StepBatcher(max_rows=64, gather_s=0.05, inflight=lambda: 1, probe_every_s=0.2,
                          on_batch=lambda key, calls: seen.append((key, calls)))

    async def together():
        first = asyncio.ensure_future(batcher.run(("m", 1, "g"), rows(0), backend.send, 60.0))
        await asyncio.sleep(0.01)
        await batcher.run(("m", 1, "g"), rows(1), backend.send, 60.0)
        await first

    async def main():
        await together()                        # before the first probe is due: each goes alone
        await asyncio.sleep(0.2)
        await together()                        # a probe: both in one call
    asyncio.run(main())
    assert backend.batches == [1, 1, 2] and seen == [(("m", 1, "g"), 1), (("m", 1, "g"), 1), (("m", 1, "g"), 2)]
