"""StepBatcher: step calls reaching it in one event-loop turn share one backend call, each caller gets its own rows
back; calls of other shapes or beyond max_rows go apart; a failure reaches every member."""
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
    backend, batcher = Backend(), StepBatcher(max_rows=64)

    async def main():
        return await asyncio.gather(*(batcher.run(("m", 1, "step_next"), rows(k, n=1 + k % 2), backend.send, 5.0)
                                      for k in range(5)))
    outputs = asyncio.run(main())
    assert backend.batches == [7] and batcher.calls == 1 and batcher.joined == 5
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
