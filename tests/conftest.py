"""Session fixtures shared by every test layer: a small synthetic dataset, a tiny real training run
(routerkt-akt, narrow and short so it trains in seconds) and that run exported into a Triton model
repository with the python backend. Heavy imports stay inside the fixtures."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"

# A narrow RouterKT so every test layer can afford it; the window is short on purpose (20), so that
# "history longer than the window" is cheap to exercise.
# The tiny models are window models (window 20) unless a test asks for a band model (band_run): the preset
# defaults of routerkt-akt and akt-standard are band models (training/models/registry.py).
TINY_OVERRIDES = ["model.d_model=16", "model.n_heads=4", "model.n_blocks=1", "model.d_ff=32",
                  "model.final_fc=32", "model.final_fc2=16", "data.window=20", "train.batch_size=64",
                  "train.lr=3e-3", "model.context=window"]


@dataclass
class TinyRepository:
    path: Path       # the model repository
    name: str        # model name inside it
    run: Path        # the training run it came from
    data: Path       # the synthetic CSV it was trained on


def dataset(name: str) -> Path:
    """Path of a shared dataset file; skips the test with a reason when ../shared is absent."""
    folder = SHARED_DATASETS / name
    for candidate in ("interactions.csv.gz", "interactions.csv"):
        if (folder / candidate).is_file():
            return folder / candidate
    pytest.skip(f"needs ../shared/datasets/{name} (not present next to this checkout)")


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread is several times faster than contended ones."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def synthetic_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from training.data.synthetic import generate, write_csv
    path = tmp_path_factory.mktemp("data") / "synthetic.csv"
    write_csv(generate(n_learners=160, seed=3), path)
    return path


def train_tiny(data: Path, out: Path, preset: str = "routerkt-akt", extra: list[str] | None = None,
               epochs: int = 2) -> Path:
    from training.config import RunConfig, apply_overrides
    from training.models.registry import preset_config
    from training.training_run import run_training
    cfg = RunConfig(preset=preset, model=preset_config(preset))
    cfg.data.path, cfg.data.folds, cfg.train.epochs = str(data), 1, epochs
    cfg = apply_overrides(cfg, TINY_OVERRIDES + (extra or []))
    run_training(cfg, out, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_run(synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny(synthetic_csv, tmp_path_factory.mktemp("runs") / "tiny")


@pytest.fixture(scope="session")
def band_run(synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny RouterKT as a band model (band 20), trained on whole histories."""
    return train_tiny(synthetic_csv, tmp_path_factory.mktemp("runs") / "band",
                      extra=["model.context=band", "data.protocol=whole"], epochs=1)


@pytest.fixture(scope="session")
def kt_band_repository(band_run: Path, synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyRepository:
    """The tiny band model exported as `routerkt export` does (step graphs included)."""
    from export.exporter import export_run
    repo = tmp_path_factory.mktemp("band_repository")
    result = export_run(band_run, repo, name="kt", log=lambda *_: None, step_graphs=True)
    return TinyRepository(path=repo, name=result.name, run=band_run, data=synthetic_csv)


@pytest.fixture(scope="session")
def kt_repository(tiny_run: Path, synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyRepository:
    from export.exporter import export_run
    repo = tmp_path_factory.mktemp("model_repository")
    result = export_run(tiny_run, repo, name="kt", log=lambda *_: None)
    return TinyRepository(path=repo, name=result.name, run=tiny_run, data=synthetic_csv)


@pytest.fixture(scope="session")
def kt_step_repository(tiny_run: Path, synthetic_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyRepository:
    """The tiny model exported with --step-graphs (the learner-state path's graphs beside rank.onnx)."""
    from export.exporter import export_run
    repo = tmp_path_factory.mktemp("step_repository")
    result = export_run(tiny_run, repo, name="kt", log=lambda *_: None, step_graphs=True)
    return TinyRepository(path=repo, name=result.name, run=tiny_run, data=synthetic_csv)
