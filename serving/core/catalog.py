"""The gateway's model catalog: what each model version in the Triton repository needs on the
gateway side (vocabulary, window, Triton's max batch size), read with routerkt/contract/repository_reader.py.

Per version folder: `vocab.json` (routerkt/contract/vocab.py) and `model_info.json`
(routerkt/contract/model_info.py); per model: `config.pbtxt` (max_batch_size). `refresh()` rescans
the repository and re-reads only what changed (file size + mtime), so a newly exported version is
picked up without a restart; a version whose files are broken is skipped with one log line (until
its files change). Lookups
never touch the disk. `refresh()` may run in a worker thread: it swaps in a new table atomically.

Skill sets: a version's config.pbtxt gives its skill inputs a last axis `skills` (dims [window, -1]),
or, for a version exported before skill sets, none (dims [window]): that version is served as
`skill_sets=False`, and the encoder (features.py) sends it each set's first skill (one log line
says so when it is read). It is not refused: an older version keeps answering beside a newer one
(canary, shadow, pinned clients), exactly as before for single-skill requests.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from routerkt.contract import signature
from routerkt.contract.repository_reader import (list_models, list_versions, read_model_info, read_served_shape,
                                          read_vocab)
from routerkt.contract.signature import (CONFIG_FILE, SCORE, Graph, graph_with_inputs, served_dims, skill_axis,
                                         zero_inputs)
from routerkt.contract.step_signature import STEP_FILES, STEP_INPUTS, holds_states, served_state_kind
from routerkt.contract.vocab import Vocab
from routerkt.errors import UserError
from serving.status_errors import not_found, shown

log = logging.getLogger("routerkt.gateway.catalog")


@dataclass(frozen=True)
class ModelVersion:
    """One servable version of a model, as the gateway sees it."""

    name: str
    version: int
    window: int              # sequence length of the model (score rows [window], rank history [window - 1])
    max_batch_size: int      # rows per Triton request (config.pbtxt)
    vocab: Vocab = field(repr=False, compare=False)
    graph: Graph = SCORE     # the contract graph the backend serves for it (from config.pbtxt's inputs)
    skill_sets: bool = True  # False: exported before skill sets, one skill per interaction (2-D skill inputs)
    explain: bool = False    # the version holds explain.onnx and its config serves the explain outputs
    step_state: str | None = None   # the state kind of its step graphs (step_signature.py), None without them
    step_served: bool = False       # its config.pbtxt declares the step graphs too (Triton can run them)
    state_held: bool = False        # ... and the held-state keys, and its model.py runs them (Triton keeps the states)
    band: bool = False              # a band model: a prediction reads the whole history (step graphs beyond W - 1)

    def probe_inputs(self) -> dict[str, np.ndarray]:
        """One padding-only request in the shape this version takes (warm-up and health probes)."""
        zeros = zero_inputs(self.graph, self.window)
        if not self.skill_sets:
            zeros = {t.name: zeros[t.name][..., 0] if skill_axis(t) else zeros[t.name] for t in self.graph.inputs}
        return zeros


@dataclass(frozen=True)
class RefreshResult:
    added: tuple[tuple[str, int], ...] = ()
    removed: tuple[tuple[str, int], ...] = ()


_Stamp = tuple[tuple[int, int], ...]      # (size, mtime_ns) of the files a version is read from


class ModelCatalog:
    """Model name -> version -> ModelVersion, read from a Triton model repository."""

    def __init__(self, repository: Path | str) -> None:
        self.repository = Path(repository)
        self._table: dict[str, dict[int, ModelVersion]] = {}
        self._stamps: dict[tuple[str, int], _Stamp] = {}
        self._broken: dict[tuple[str, int], _Stamp] = {}   # versions that failed to read, by stamp
        self._missing: set[tuple[str, int]] = set()          # versions lacking a file (logged once)
        self._refreshing = threading.Lock()                  # one refresh at a time (worker threads)

    # -- lookups (no I/O) --------------------------------------------------------------------------
    def models(self) -> list[str]:
        return sorted(self._table)

    def versions(self, name: str) -> list[int]:
        return sorted(self._table.get(name, {}))

    def max_window(self) -> int:
        """The longest window of any version (0 for an empty catalog)."""
        return max((v.window for versions in self._table.values() for v in versions.values()), default=0)

    def snapshot(self) -> dict[str, dict[int, ModelVersion]]:
        """The current table (do not mutate)."""
        return self._table

    def get(self, name: str, version: int) -> ModelVersion:
        """Version `version` of `name` (version must be > 0); NOT_FOUND otherwise."""
        versions = self._table.get(name)
        if not versions:
            raise not_found(f"unknown model {shown(name)}", field="model")
        if version not in versions:
            raise not_found(f"model {shown(name)} has no version {version} (versions: {sorted(versions)})",
                            field="version")
        return versions[version]

    def require_model(self, name: str) -> dict[int, ModelVersion]:
        versions = self._table.get(name)
        if not versions:
            raise not_found(f"unknown model {shown(name)}", field="model")
        return versions

    # -- loading --------------------------------------------------------------------------------------
    def refresh(self) -> RefreshResult:
        """Rescan the repository; (re)read versions whose files changed. Never raises for a bad
        version (it is skipped and logged); returns what appeared and disappeared."""
        with self._refreshing:
            return self._refresh()

    def _refresh(self) -> RefreshResult:
        table: dict[str, dict[int, ModelVersion]] = {}
        stamps: dict[tuple[str, int], _Stamp] = {}
        for name in _safe(list_models, self.repository) or []:
            config_path = self.repository / name / CONFIG_FILE
            for version in _safe(list_versions, self.repository, name) or []:
                key = (name, version)
                stamp = self._stamp(config_path, name, version)
                if stamp is None:
                    continue
                old = self._table.get(name, {}).get(version)
                if old is not None and self._stamps.get(key) == stamp:
                    entry: ModelVersion | None = old
                elif self._broken.get(key) == stamp:
                    entry = None
                else:
                    entry = self._read(name, version, config_path, stamp)
                if entry is not None:
                    table.setdefault(name, {})[version] = entry
                    stamps[key] = stamp
        before = {(n, v) for n, vs in self._table.items() for v in vs}
        after = {(n, v) for n, vs in table.items() for v in vs}
        self._table, self._stamps = table, stamps                 # atomic swap for readers
        return RefreshResult(added=tuple(sorted(after - before)), removed=tuple(sorted(before - after)))

    def _read(self, name: str, version: int, config_path: Path, stamp: _Stamp) -> ModelVersion | None:
        try:
            info = read_model_info(self.repository, name, version)
            window = info.window
            shape = read_served_shape(self.repository, name)
            if shape.max_batch_size < 1:
                raise UserError(f"{config_path}: max_batch_size must be >= 1 (the gateway sends [rows, window])")
            dims = {n: d for n, d in zip(shape.input_names, shape.input_dims) if n not in STEP_INPUTS}
            graph = graph_with_inputs(dims)
            if graph is None:
                raise UserError(f"{config_path}: inputs {list(dims)} are none of the contract's graphs")
            skill_sets = _skill_sets(graph, window, dims)
            if skill_sets is None:
                raise UserError(f"{config_path}: input dims {[list(d) for d in shape.input_dims]} do not match the "
                                f"window {window} of {signature.INFO_FILE}")
            vocab = read_vocab(self.repository, name, version)
            folder = self.repository / name / str(version)
            explain = (graph is signature.RANK and signature.EXPLAIN_ATTENTION in shape.output_names
                       and (folder / signature.EXPLAIN_ONNX_FILE).is_file())
            stepped = skill_sets and all((folder / file).is_file() for file in STEP_FILES.values())
            step_state = info.step_state if stepped else None
            step_served = step_state is not None and served_state_kind(shape.input_names) == step_state
            state_held = step_served and holds_states(shape.input_names) and info.held_states
            if info.band and step_state is None:
                raise UserError(f"a band model's version needs its step graphs ({', '.join(STEP_FILES.values())})")
        except (UserError, OSError, UnicodeDecodeError) as exc:
            self._broken[(name, version)] = stamp
            log.error("skipping model %s version %s: %s", name, version, str(exc).splitlines()[0])
            return None
        self._broken.pop((name, version), None)
        log.info("model %s version %s: %s graph, window %d, %d questions, %d skills", name, version, graph.name,
                 window, len(vocab.questions), len(vocab.skills))
        if not skill_sets:
            log.warning("model %s version %s was exported before skill sets (one skill per interaction): it gets "
                        "each set's first skill", name, version)
        return ModelVersion(name=name, version=version, window=window, max_batch_size=shape.max_batch_size,
                            vocab=vocab, graph=graph, skill_sets=skill_sets, explain=explain,
                            step_state=step_state, step_served=step_served, state_held=state_held,
                            band=info.band)

    def _stamp(self, config_path: Path, name: str, version: int) -> _Stamp | None:
        folder = self.repository / name / str(version)
        try:
            stats = [os.stat(p) for p in (config_path, folder / signature.INFO_FILE, folder / signature.VOCAB_FILE)]
        except OSError as exc:   # half-published, being removed, or not a gateway-servable export
            if (name, version) not in self._missing:
                self._missing.add((name, version))
                log.warning("model %s version %s is not servable by the gateway: %s is missing",
                            name, version, Path(exc.filename or "?").name)
            return None
        self._missing.discard((name, version))
        return tuple((s.st_size, s.st_mtime_ns) for s in stats)


def _skill_sets(graph: Graph, window: int, dims: dict[str, tuple[int, ...]]) -> bool | None:
    """True: `dims` (config.pbtxt, per input) are the contract's; False: the contract's without the
    skill axis (a version exported before skill sets); None: neither."""
    expected = served_dims(graph, window)
    if all(expected[name] == d for name, d in dims.items()):
        return True
    legacy = {t.name: expected[t.name][:-1] if skill_axis(t) else expected[t.name] for t in graph.inputs}
    return False if all(legacy[name] == d for name, d in dims.items()) else None


def _safe(function, *args):
    try:
        return function(*args)
    except OSError as exc:
        log.error("cannot scan the model repository: %s", exc)
        return None


