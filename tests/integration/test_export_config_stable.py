"""config.pbtxt holds nothing of one version: two exports of the same preset, window, backend and
graph with different vocabularies render the same bytes (the id bounds are in each version's
model_info.json, where the python model reads them), so publishing the second next to the first
leaves the served config untouched and Triton loads only the new version."""
from __future__ import annotations

import pandas as pd
import pytest

from routerkt.contract.repository_reader import list_versions, parse_triton_config, read_model_info
from routerkt.contract.signature import CONFIG_FILE
from tests.conftest import train_tiny

pytestmark = pytest.mark.integration


def test_exports_with_other_vocabularies_publish_the_same_config(tiny_run, synthetic_csv, tmp_path) -> None:
    from export.exporter import export_run

    rows = pd.read_csv(synthetic_csv)
    small = tmp_path / "small.csv"
    rows[rows["question_id"] % 2 == 0].to_csv(small, index=False)       # about half the questions
    small_run = train_tiny(small, tmp_path / "runs" / "small", epochs=1)

    quiet = lambda *_: None                                              # noqa: E731
    repo = tmp_path / "repo"
    export_run(tiny_run, repo, name="kt", log=quiet)
    config_path = repo / "kt" / CONFIG_FILE
    config, before = config_path.read_bytes(), config_path.stat().st_mtime_ns
    parsed = parse_triton_config(config.decode())
    assert parsed.version_policy.HasField("all")
    assert not {"N_QUESTIONS", "N_SKILLS", "run_id", "git_sha"} & set(parsed.parameters)

    export_run(small_run, repo, name="kt", log=quiet)                    # another vocabulary, as version 2
    assert list_versions(repo, "kt") == [1, 2]
    assert read_model_info(repo, "kt", 1).n_questions > read_model_info(repo, "kt", 2).n_questions
    # a config without bounds is kept only when the new text is byte-identical (publish_config),
    # and publish_version rewrites a config whose bytes differ: neither happened
    assert config_path.read_bytes() == config and config_path.stat().st_mtime_ns == before
