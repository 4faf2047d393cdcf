"""Fixtures for the integration tests of the gateway: a hand-made model repository (vocab.json,
model_info.json, config.pbtxt; no ONNX, no torch) that the gateway's registry can read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

HANDMADE_WINDOW = 6


def write_gateway_version(repo: Path, name: str, version: int, window: int = HANDMADE_WINDOW) -> None:
    from routerkt.contract import signature
    from export.repository import publish_version
    from export.triton_config import PARAM_N_QUESTIONS, PARAM_N_SKILLS, TritonModelOptions, render_config
    from routerkt.contract.model_info import ModelInfo
    from routerkt.contract.vocab import Vocab

    vocab = Vocab(questions={100: 2, 101: 3, 102: 4}, skills={7: 2, 8: 3}, question_skill={100: 7, 101: 8, 102: 7})
    options = TritonModelOptions(window=window, parameters={PARAM_N_QUESTIONS: str(vocab.n_questions),
                                                            PARAM_N_SKILLS: str(vocab.n_skills)})
    files = {signature.VOCAB_FILE: json.dumps(vocab.to_json()).encode(),
             signature.INFO_FILE: ModelInfo(name=name, window=window).save_bytes(), "model.py": b"# not run here\n"}
    publish_version(repo, name, files, render_config(name, options), version=version)


@pytest.fixture(scope="module")
def handmade_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("gateway") / "model_repository"
    write_gateway_version(repo, "kt", 1)
    return repo
