"""An in-process inference backend: each catalog version's model.onnx run with onnxruntime on the
gateway's CPU, with the session settings of the Triton python-backend model
(routerkt/contract/onnx_session.py). For development without Triton and for tests of the
code around the backend; the production path and the e2e tests use a real Triton.

Each version's served graph (model.onnx: score, rank.onnx: rank) is run; a version without that
file is not served here. A version the catalog marks `explain` (explain.onnx beside rank.onnx) also
gets a session of the explain graph, run for the explain call (`infer_outputs`, serving/queries/explain.py)
with the python-backend model's output names (signature.EXPLAIN); as there, a version whose graphs
do not all load is not served. A version the catalog gives a `step_state` (step_start/append/next.onnx,
`routerkt export --step-graphs`) also gets sessions of its three step graphs, run by `infer_step` for
the learner-state path (serving/state/); a version whose step graphs fail to load is served without
them (one log line); a small step_append or step_next (at most INLINE_ROWS learners x candidates:
0.24-0.7 ms in onnxruntime for routerkt-akt) runs on the event loop itself, since the hop to a worker
thread and back cost the gateway more CPU than the run (`routerkt bench incremental`, docs/benchmarks.md).
Sessions are built in a worker thread when a version first appears
in the catalog and run in worker threads, so the event loop never blocks on a forward pass.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np

from routerkt.contract.onnx_session import cpu_session
from routerkt.contract.repository_reader import version_dir
from routerkt.contract.signature import EXPLAIN_ONNX_FILE, ONNX_FILE, RANK, RANK_ONNX_FILE
from routerkt.contract.step_signature import STEP_FILES, STEP_GRAPHS
from serving.core.catalog import ModelCatalog, ModelVersion
from serving.pipeline.parts import BackendError, FailureKind
from serving.settings import Settings

log = logging.getLogger("routerkt.gateway.onnxruntime")
INLINE_ROWS = 32         # step_append learners / step_next learners x candidates run without a thread hop


class OnnxRuntimeBackend:
    """InferenceBackend that runs the repository's ONNX files in this process."""

    def __init__(self, settings: Settings, threads: int = 1) -> None:
        self.settings = settings
        self.threads = threads
        self._sessions: dict[tuple[str, int], object] = {}
        self._explain: dict[tuple[str, int], object] = {}        # versions with the explain graph
        self._steps: dict[tuple[str, int], dict[str, object]] = {}   # versions with step graphs: name -> session
        self._broken: set[tuple[str, int]] = set()
        self._wake = asyncio.Event()

    async def start(self, catalog: ModelCatalog) -> None:
        await self._load_new(catalog)

    async def maintain(self, catalog: ModelCatalog) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.settings.probe_interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            await self._load_new(catalog)

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        self._sessions.clear()
        self._explain.clear()
        self._steps.clear()

    async def _load_new(self, catalog: ModelCatalog) -> None:
        table = catalog.snapshot()
        wanted = {(name, v) for name, versions in table.items() for v in versions}
        for key in set(self._sessions) - wanted:            # removed from the repository
            del self._sessions[key]
            self._explain.pop(key, None)
            self._steps.pop(key, None)
        for name, version in sorted(wanted - set(self._sessions) - self._broken):
            entry = table[name][version]
            folder = version_dir(catalog.repository, name, version)
            try:
                if entry.explain:                           # before the served graph: ready means both load
                    self._explain[(name, version)] = await asyncio.to_thread(
                        cpu_session, folder / EXPLAIN_ONNX_FILE, self.threads)
                self._sessions[(name, version)] = await asyncio.to_thread(
                    cpu_session, folder / (RANK_ONNX_FILE if entry.graph is RANK else ONNX_FILE), self.threads)
                log.info("onnxruntime: loaded model %s version %d%s", name, version,
                         " with its explain graph" if entry.explain else "")
                if entry.step_state is not None:
                    await self._load_steps(name, version, folder)
            except Exception as exc:                         # no ONNX file, or one onnxruntime refuses
                self._broken.add((name, version))
                self._explain.pop((name, version), None)
                log.error("onnxruntime: cannot load model %s version %d: %s", name, version,
                          str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)

    async def _load_steps(self, name: str, version: int, folder: Path) -> None:
        try:
            self._steps[(name, version)] = {graph: await asyncio.to_thread(cpu_session, folder / file, self.threads)
                                            for graph, file in STEP_FILES.items()}
            log.info("onnxruntime: loaded the step graphs of model %s version %d", name, version)
        except Exception as exc:                             # served without them: every call takes the full forward
            log.error("onnxruntime: model %s version %d is served without its step graphs: %s", name, version,
                      str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)

    @property
    def serving(self) -> bool:
        return bool(self._sessions)

    def ready_versions(self, model: str) -> frozenset[int]:
        return frozenset(v for name, v in self._sessions if name == model)

    async def ensure_ready(self, model: str, version: int, timeout_s: float) -> bool:
        """Every catalog version loads on its own (maintain); wait for this one up to timeout_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.wake()
        while (model, version) not in self._sessions and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return (model, version) in self._sessions

    def ready_models(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for name, version in sorted(self._sessions):
            out.setdefault(name, []).append(version)
        return out

    def unavailable_reason(self, model: str) -> str | None:
        return None

    def describe(self) -> dict[str, object]:
        return {"backend": "onnxruntime"}

    async def infer(self, model: ModelVersion, feeds: dict[str, np.ndarray], timeout_s: float) -> np.ndarray:
        session = self._session(self._sessions, model)
        return (await self._run(session, model, feeds, model.graph.output_names[:1], timeout_s))[0]

    async def infer_outputs(self, model: ModelVersion, feeds: dict[str, np.ndarray], outputs: tuple[str, ...],
                            timeout_s: float) -> dict[str, np.ndarray]:
        """The explain call (serving/queries/explain.py): `outputs` of the version's explain graph."""
        if (model.name, model.version) in self._sessions and (model.name, model.version) not in self._explain:
            raise BackendError(FailureKind.REJECTED, f"{model.name} version {model.version} has no explain graph")
        session = self._session(self._explain, model)
        return dict(zip(outputs, await self._run(session, model, feeds, outputs, timeout_s)))

    def steps(self, model: ModelVersion) -> bool:
        return (model.name, model.version) in self._steps

    def holds_states(self, model: ModelVersion) -> bool:
        """In process, the gateway's cache is where the states are: nothing to hold apart."""
        return False

    async def infer_step(self, model: ModelVersion, graph: str, feeds: dict[str, np.ndarray],
                         timeout_s: float) -> dict[str, np.ndarray]:
        """Every output of the step graph `graph` (the learner-state path, serving/state/), by name."""
        sessions = self._steps.get((model.name, model.version))
        if sessions is None:
            raise BackendError(FailureKind.REJECTED, f"{model.name} version {model.version} has no step graphs")
        spec = STEP_GRAPHS[model.step_state].graph(graph)
        feeds = {t.name: np.ascontiguousarray(feeds[t.name], dtype=t.dtype) for t in spec.inputs}
        candidates = feeds["candidate_questions"].shape[1] if "candidate_questions" in feeds else 1
        rows = feeds[spec.inputs[0].name].shape[0] * candidates
        try:
            if spec.name != "step_start" and rows <= INLINE_ROWS:
                got = sessions[graph].run(None, feeds)
            else:
                got = await asyncio.wait_for(asyncio.to_thread(sessions[graph].run, None, feeds), timeout_s)
        except asyncio.TimeoutError:
            raise BackendError(FailureKind.DEADLINE, "onnxruntime did not finish in time") from None
        except Exception as exc:
            raise BackendError(FailureKind.FAILED, str(exc)) from None
        return dict(zip(spec.output_names, got))

    @staticmethod
    def _session(sessions: dict[tuple[str, int], object], model: ModelVersion):
        session = sessions.get((model.name, model.version))
        if session is None:
            raise BackendError(FailureKind.NOT_LOADED, f"{model.name} version {model.version} is not loaded")
        return session

    @staticmethod
    async def _run(session, model: ModelVersion, feeds: dict[str, np.ndarray], outputs: tuple[str, ...],
                   timeout_s: float) -> list[np.ndarray]:
        """`outputs` of one run of `session` on the graph's int64 inputs, as float32, in a worker thread."""
        feeds = {name: np.ascontiguousarray(feeds[name], dtype=np.int64) for name in model.graph.input_names}
        try:
            got = await asyncio.wait_for(asyncio.to_thread(session.run, list(outputs), feeds), timeout_s)
        except asyncio.TimeoutError:
            raise BackendError(FailureKind.DEADLINE, "onnxruntime did not finish in time") from None
        except Exception as exc:
            raise BackendError(FailureKind.FAILED, str(exc)) from None
        return [np.asarray(a, dtype=np.float32) for a in got]
