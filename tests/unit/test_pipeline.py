"""Tests of training/data/pipeline.py: one data pipeline for training, evaluation and export (export's
parity batches honour data.skill_rows like training), and portable dataset paths in run records."""
from __future__ import annotations

import os

import numpy as np
import pytest

from routerkt.errors import UserError
from routerkt.contract.signature import PAD_ID
from training.config import DataConfig, RunConfig, SkillRows
from training.data import pipeline
from training.data.pipeline import (dataset_name, load_run_data, load_sequences, portable_data, portable_path,
                                    resolve_data_path)

pytestmark = pytest.mark.unit

HEADER = "user_id,order,question_id,skill_id,correct\n"


def _multi_skill_csv(folder, learners: int = 12, problems: int = 3):
    """Each learner: `problems` problems of 2 skills each, written as 2 rows per problem (assist2009 style)."""
    rows = []
    for u in range(learners):
        for k in range(problems):
            q = 10 * u + k
            rows += [f"{u},{2 * k},{q},{k},{(u + k) % 2}", f"{u},{2 * k + 1},{q},{k + 3},{(u + k) % 2}"]
    path = folder / "interactions.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


def test_skill_rows_applies_to_every_reader(tmp_path):
    path = _multi_skill_csv(tmp_path)
    expanded = DataConfig(path=str(path), window=10, min_interactions=2, folds=2, skill_rows=SkillRows.EXPAND)
    first = DataConfig(path=str(path), window=10, min_interactions=2, folds=2, skill_rows=SkillRows.FIRST)
    merged = DataConfig(path=str(path), window=10, min_interactions=2, folds=2)      # the default
    assert set(load_sequences(expanded)[1].lengths.tolist()) == {6}
    data = load_run_data(first)
    assert set(data.sequences.lengths.tolist()) == {3} and len(data.folds) == 2
    assert data.sequences.skills.shape == (12, 10, 1) and "dropped 36 expanded multi-skill rows" in data.note
    data = load_run_data(merged)
    assert set(data.sequences.lengths.tolist()) == {3} and data.sequences.skills.shape == (12, 10, 2)
    assert "merged 36 expanded multi-skill rows into their interactions" in data.note
    real = data.sequences.responses >= 0
    assert (data.sequences.skills[real] != PAD_ID).all() and (data.sequences.skills[~real] == PAD_ID).all()


def test_export_parity_batches_honour_skill_rows(tmp_path):
    from export.exporter import real_batches
    path = _multi_skill_csv(tmp_path)
    for skill_rows, k in ((SkillRows.FIRST, 1), (SkillRows.MERGE, 2)):
        config = RunConfig(data=DataConfig(path=str(path), window=10, min_interactions=2, skill_rows=skill_rows))
        vocab, _ = load_sequences(config.data)
        batches = real_batches(config, vocab)
        assert batches
        for _, skills, responses in batches:
            assert ((responses >= 0).sum(axis=1) == 3).all()          # 3 problems, not 6 rows
            assert skills.shape == responses.shape + (k,)


def test_export_parity_batches_are_empty_without_the_data_file(tmp_path):
    from export.exporter import real_batches
    config = RunConfig(data=DataConfig(path=str(tmp_path / "gone.csv")))
    assert real_batches(config, None) == []


def test_a_run_with_no_usable_learner_is_refused(tmp_path):
    path = _multi_skill_csv(tmp_path, learners=2)
    with pytest.raises(UserError, match="no learner has >= 50 interactions"):
        load_sequences(DataConfig(path=str(path), min_interactions=50))


def test_paths_are_recorded_relative_to_the_data_root_or_the_working_directory(tmp_path, monkeypatch):
    root, work = tmp_path / "datasets", tmp_path / "work"
    (root / "toy").mkdir(parents=True)
    (work / "data").mkdir(parents=True)
    in_root = _multi_skill_csv(root / "toy", problems=5)
    in_work = (work / "data" / "mine.csv.gz")
    in_work.write_bytes(b"")
    monkeypatch.setattr(pipeline, "DATA_ROOT", root)
    monkeypatch.chdir(work)
    assert portable_path(in_root) == "toy/interactions.csv"
    assert portable_path(in_work) == "data/mine.csv.gz"
    assert portable_path(os.path.relpath(in_root)) == "toy/interactions.csv"      # ../datasets/toy/...
    assert portable_path(tmp_path / "elsewhere.csv") == str(tmp_path / "elsewhere.csv")   # no portable form
    assert resolve_data_path("toy/interactions.csv") == root / "toy" / "interactions.csv"
    assert resolve_data_path("data/mine.csv.gz").resolve() == in_work.resolve()
    assert dataset_name(in_root) == "toy" and dataset_name(in_work) == "mine"
    recorded = portable_data(DataConfig(path=str(in_root)))
    assert (recorded.path, recorded.dataset) == ("toy/interactions.csv", "toy")
    assert portable_data(recorded) == recorded                                      # stable once recorded
    assert np.array_equal(load_sequences(recorded)[1].lengths, load_sequences(DataConfig(path=str(in_root)))[1].lengths)
