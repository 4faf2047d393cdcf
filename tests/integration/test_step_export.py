"""The step graphs in onnxruntime for every preset: learners starting from every history length 0 .. W - 1
append one interaction at a time, are rebuilt with step_start past the window edge (kept W - 1), and after
each step step_next gives the exported rank graph's probabilities on each learner's last W - 1
interactions (C = 1 with one-skill sets, C = 3 with sets of one or two), in one batch of learners of
different kept lengths. A model the step path cannot step gets no step graph; `routerkt
export` publishes them beside rank.onnx by default and model_info.json names them; --no-step-graphs leaves them out.

Exports are slow (dynamo, ~5 s a graph), so each preset's four graphs are kept in pytest's cache folder
under a key of everything they are made of (the model's weights, the sources of training/models, export and
routerkt/contract, the library versions): a run after a change of any of them exports again."""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from export.cli_export import add_arguments, run
from export.onnx_export import PARITY_TOL, export_rank_onnx, skill_sets
from export.step_export import StepSessions, export_step_graphs, step_graphs_of
from routerkt.contract import signature
from routerkt.contract.model_info import ModelInfo
from routerkt.contract.onnx_session import cpu_session
from routerkt.contract.repository_reader import parse_triton_config
from routerkt.contract.step_signature import STEP_FILES, served_state_kind
from tests.tiny_models import random_tiny_model
from training.config import RoutingScope
from training.models.registry import PRESETS

pytestmark = pytest.mark.integration
NQ, NS, W = 40, 12, 8
STEPS = W + 3                        # every learner appends this many: through the edge and past it
ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("training/models", "training/config.py", "export", "routerkt/contract")


def _key(name: str, model) -> str:
    import onnx
    import onnxruntime
    import torch
    digest = hashlib.sha256(f"{name} {NQ} {NS} {W} {torch.__version__} {onnx.__version__} "
                            f"{onnxruntime.__version__}".encode())
    for path in sorted(p for source in SOURCES for p in ([ROOT / source] if source.endswith(".py")
                                                          else (ROOT / source).rglob("*.py"))):
        digest.update(path.relative_to(ROOT).as_posix().encode() + path.read_bytes())
    for pname, tensor in model.state_dict().items():
        digest.update(pname.encode() + tensor.numpy().tobytes())
    return digest.hexdigest()[:24]


@pytest.fixture(scope="module")
def exported(request, tmp_path_factory):
    """name -> (model, folder holding its step graphs and rank.onnx), exported once per content key
    (kept across runs in pytest's cache folder; in a temporary one under `-p no:cacheprovider`, as in CI)."""
    kept = getattr(request.config, "cache", None)
    cache = Path(kept.mkdir("step-graphs")) if kept is not None else tmp_path_factory.mktemp("step-graphs")
    done: dict = {}

    def get(name: str):
        if name not in done:
            model = random_tiny_model(name, NQ, NS, W)
            folder = cache / _key(name, model)
            if not (folder / signature.RANK_ONNX_FILE).is_file():
                partial = folder.with_name(folder.name + ".partial")
                shutil.rmtree(partial, ignore_errors=True)
                assert export_step_graphs(model, partial, log=lambda *_: None) is not None
                export_rank_onnx(model, partial / signature.RANK_ONNX_FILE)
                partial.rename(folder)
            done[name] = (model, folder)
        return done[name]
    return get


def _interactions(rng, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One learner's n interactions: questions [n], skill sets [n, 2] of one or two skills, responses [n]."""
    return (rng.integers(2, NQ, n), skill_sets(rng, NS, (n,), 2), rng.integers(0, 2, n))


def _left_padded(rows: list[tuple[np.ndarray, ...]], length: int) -> tuple[np.ndarray, ...]:
    """Each learner's last `length` interactions, left-padded: [B, length] (skills [B, length, 2])."""
    out = []
    for field, pad in enumerate((signature.PAD_ID, signature.PAD_ID, signature.PAD_RESPONSE)):
        block = np.full((len(rows), length, *rows[0][field].shape[1:]), pad, dtype=np.int64)
        for b, row in enumerate(rows):
            kept = row[field][max(0, len(row[field]) - length):]
            block[b, length - len(kept):] = kept
        out.append(block)
    return tuple(out)


def _widen(skills: np.ndarray, width: int) -> np.ndarray:
    return np.pad(skills, [(0, 0)] * (skills.ndim - 1) + [(0, width - skills.shape[-1])])


class Learners:
    """B learners, learner b starting with b interactions; each step appends one per learner, or rebuilds
    from its last W - 1 once it has W - 1 kept (the contract's edge rule), learners of one batch apart."""

    def __init__(self, steps: StepSessions, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.rows = [_interactions(rng, b + STEPS) for b in range(W)]
        self.seen = list(range(W))
        self.steps, self.appends, self.rebuilds = steps, 0, 0
        self.state = steps.start(*self.history())

    def history(self, which=None) -> tuple[np.ndarray, ...]:
        which = range(len(self.rows)) if which is None else which
        return _left_padded([tuple(x[:self.seen[b]] for x in self.rows[b]) for b in which], W - 1)

    def step(self) -> None:
        kept = [min(n, W - 1) for n in self.seen]
        append = [b for b in range(W) if kept[b] < W - 1]
        parts = []
        if append:
            new = [np.stack([self.rows[b][f][self.seen[b]] for b in append])[:, None] for f in range(3)]   # [B, 1]
            parts.append((append, self.steps.append([s[append] for s in self.state], *new)))
        self.seen = [n + 1 for n in self.seen]
        rebuild = [b for b in range(W) if b not in append]
        if rebuild:
            parts.append((rebuild, self.steps.start(*self.history(rebuild))))
        merged = [np.empty_like(s) for s in self.state]
        for which, state in parts:
            for whole, part in zip(merged, state):
                whole[which] = part
        self.state, self.appends, self.rebuilds = merged, self.appends + len(append), self.rebuilds + len(rebuild)


def _gap(learners: Learners, rank, candidates: int, width: int, seed: int, flip: bool = False) -> float:
    """max |step_next - rank graph| over the learners for random candidates (skill sets [.., width])."""
    rng = np.random.default_rng(seed)
    cq = rng.integers(2, NQ, (W, candidates))
    cs = skill_sets(rng, NS, (W, candidates), width)
    got = learners.steps.next(learners.state, cq, cs)
    q, s, r = learners.history()
    if flip:                                                   # the test can fail: another last answer
        r = np.where(r >= 0, r, 0)
        r[:, -1] = 1 - r[:, -1]
    feeds = dict(zip(signature.RANK.input_names, (q, _widen(s, 2), r, cq, _widen(cs, 2))))
    ref = rank.run([signature.CANDIDATE_PROBS], feeds)[0]
    return float(np.abs(got - ref).max())


@pytest.mark.parametrize("name", list(PRESETS))
def test_step_graphs_give_the_rank_graph_through_the_window_edge(name, exported):
    model, folder = exported(name)
    assert sorted(p.name for p in folder.glob("step_*.onnx")) == sorted(STEP_FILES.values())
    learners = Learners(StepSessions(folder, step_graphs_of(model)))
    rank = cpu_session(folder / signature.RANK_ONNX_FILE)
    worst = max(_gap(learners, rank, 1, 1, seed=0), _gap(learners, rank, 3, 2, seed=1))
    for call in range(STEPS):
        learners.step()
        worst = max(worst, _gap(learners, rank, 1, 1, seed=2 * call + 2), _gap(learners, rank, 3, 2, seed=2 * call + 3))
    print(f"{name}: max |step_next - rank graph| = {worst:.2e}")       # shown with -rP
    assert worst <= PARITY_TOL, worst
    assert learners.seen == [b + STEPS for b in range(W)]
    assert learners.appends == sum(W - 1 - b for b in range(W)) and learners.rebuilds == W * STEPS - learners.appends
    assert _gap(learners, rank, 3, 2, seed=99, flip=True) > 1e-4


def test_a_model_the_step_path_cannot_step_gets_no_step_graph(tmp_path):
    model = random_tiny_model("routerkt-akt", NQ, NS, W, routing_scope=RoutingScope.SEQUENCE)
    lines: list[str] = []
    assert export_step_graphs(model, tmp_path / "step", log=lines.append) is None
    assert not (tmp_path / "step").exists() and len(lines) == 1 and "'sequence'" in lines[0], lines


def test_export_step_graphs_publishes_them_beside_the_rank_graph(kt_repository, tmp_path):
    default = kt_repository.path / kt_repository.name / "1"
    assert not list(default.glob("step_*.onnx"))
    default_info = json.loads((default / signature.INFO_FILE).read_text())
    assert "step_graphs" not in default_info and ModelInfo.from_json(default_info).step_state is None

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    repo = tmp_path / "repo"
    assert run(parser.parse_args(["--run", str(kt_repository.run), "--repository", str(repo), "--name", "kt"])) == 0
    version = repo / "kt" / "1"                   # a plain `routerkt export`: the step graphs too
    assert {p.name for p in version.glob("*.onnx")} >= {signature.RANK_ONNX_FILE, *STEP_FILES.values()}
    info = ModelInfo.load(version / signature.INFO_FILE)
    assert info.step_state == "attention" and set(info.step_graphs) == set(STEP_FILES)
    assert info.step_parity_max_abs_diff <= PARITY_TOL
    # the rank model's config declares the step graphs too (Triton runs them: tests/e2e/test_learner_states_triton.py)
    stepped, plain = (parse_triton_config((r / "kt" / signature.CONFIG_FILE).read_text())
                      for r in (repo, kt_repository.path))
    assert served_state_kind(t.name for t in stepped.input) == "attention"
    assert served_state_kind(t.name for t in plain.input) is None
    assert [t.name for t in plain.input] == [t.name for t in stepped.input][:len(plain.input)]
    left_out = tmp_path / "without"
    assert run(parser.parse_args(["--run", str(kt_repository.run), "--repository", str(left_out), "--name", "kt",
                                  "--no-step-graphs"])) == 0
    assert not list((left_out / "kt" / "1").glob("step_*.onnx"))


def test_the_gateway_holds_states_only_for_a_version_whose_model_py_and_config_both_can(kt_step_repository,
                                                                                        tmp_path):
    """model_info.json's held_states (this export's model.py runs the held graphs) and config.pbtxt's state_ref /
    keep_as: a version exported before held states (no held_states) or a config without them (--held-state-mib 0)
    gets its states sent, so a new config never sends keys to an older version's model.py."""
    from export.triton_config import TritonModelOptions, render_config
    from serving.core.catalog import ModelCatalog

    def served(field: str) -> bool:
        catalog = ModelCatalog(repo)
        catalog.refresh()
        return getattr(catalog.get("kt", 1), field)
    repo = tmp_path / "repo"
    shutil.copytree(kt_step_repository.path, repo)
    version = repo / "kt" / "1"
    info = json.loads((version / signature.INFO_FILE).read_text())
    assert info["held_states"] is True
    assert served("state_held")

    older = {k: v for k, v in info.items() if k != "held_states"}
    (version / signature.INFO_FILE).write_text(json.dumps(older))
    assert served("step_served") and not served("state_held")
    (version / signature.INFO_FILE).write_text(json.dumps(info))
    config = repo / "kt" / signature.CONFIG_FILE
    options = TritonModelOptions(graph="rank", step_state="attention", window=info["window"], held_state_mib=0)
    config.write_text(render_config("kt", options))
    assert served("step_served") and not served("state_held")
