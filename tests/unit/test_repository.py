"""Model repository: atomic publication, version numbering and pruning, listing, bad input."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from export import repository as repo_mod
from export.repository import publish_version
from routerkt.contract.model_info import ModelInfo
from routerkt.contract.repository_reader import latest_version, list_models, list_versions, read_model_info
from routerkt.contract.signature import CONFIG_FILE, INFO_FILE, ONNX_FILE, VOCAB_FILE
from routerkt.errors import UserError

pytestmark = pytest.mark.unit

README_TEXT = "# model_repository/ (generated; do not edit)\n"


def _files(tmp_path: Path, tag: str) -> dict[str, Path | bytes]:
    onnx = tmp_path / f"src-{tag}.onnx"
    onnx.write_bytes(f"onnx-{tag}".encode())
    return {ONNX_FILE: onnx, VOCAB_FILE: b'{"questions": {}}',
            INFO_FILE: ModelInfo(name="kt", window=100, provenance={"tag": tag}).save_bytes()}


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root (and its parent's entries) with file contents: a full picture."""
    tree: dict[str, bytes | None] = {}
    for path in sorted(root.parent.rglob("*")):
        if "src-" in path.name:
            continue
        tree[str(path.relative_to(root.parent))] = path.read_bytes() if path.is_file() else None
    return tree


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "space" / "model_repository"
    path.mkdir(parents=True)
    (path / "README.md").write_text(README_TEXT)
    return path


def test_first_publication_creates_the_model_with_layout_and_config(repo: Path, tmp_path: Path) -> None:
    version = publish_version(repo, "routerkt-akt", _files(tmp_path, "a"), 'name: "routerkt-akt"\n')
    assert version == 1
    model = repo / "routerkt-akt"
    assert (model / CONFIG_FILE).read_text() == 'name: "routerkt-akt"\n'
    assert sorted(p.name for p in (model / "1").iterdir()) == sorted([ONNX_FILE, VOCAB_FILE, INFO_FILE])
    assert (model / "1" / ONNX_FILE).read_bytes() == b"onnx-a"
    assert list_models(repo) == ["routerkt-akt"]
    assert list_versions(repo, "routerkt-akt") == [1]
    assert latest_version(repo, "routerkt-akt") == 1
    info = read_model_info(repo, "routerkt-akt", 1)
    assert (info.provenance, info.window) == ({"tag": "a"}, 100)
    assert not list(repo.parent.glob(".*staging*"))          # staging folder removed


def test_repository_folder_is_created_when_missing(tmp_path: Path) -> None:
    repo = tmp_path / "fresh" / "repo"
    assert publish_version(repo, "m", _files(tmp_path, "a"), "cfg") == 1
    assert list_versions(repo, "m") == [1]


def test_versions_increase_config_is_replaced_and_old_versions_are_pruned(repo: Path, tmp_path: Path) -> None:
    for i in range(1, 6):
        assert publish_version(repo, "kt", _files(tmp_path, str(i)), f"cfg {i}", keep_versions=3) == i
    assert list_versions(repo, "kt") == [3, 4, 5]
    assert (repo / "kt" / CONFIG_FILE).read_text() == "cfg 5"
    assert read_model_info(repo, "kt", 5).provenance["tag"] == "5"
    assert not [p for p in (repo / "kt").iterdir() if p.name.startswith(".")]   # no temp files left
    assert not list(repo.parent.glob(".*staging*"))


def test_an_unchanged_config_is_not_rewritten_and_model_py_is_compiled_in_place(repo: Path, tmp_path: Path) -> None:
    """Triton reloads every version of a model whose config.pbtxt was rewritten, and its Python
    stub writes __pycache__ into a served folder unless the folder already has one."""
    files = {**_files(tmp_path, "a"), "model.py": b"VALUE = 1\n"}
    publish_version(repo, "kt", files, "cfg")
    config = repo / "kt" / CONFIG_FILE
    stamp = config.stat().st_mtime_ns, config.stat().st_ino
    publish_version(repo, "kt", {**_files(tmp_path, "b"), "model.py": b"VALUE = 2\n"}, "cfg")
    assert (config.stat().st_mtime_ns, config.stat().st_ino) == stamp          # same file, untouched
    compiled = sorted(p.name for p in (repo / "kt" / "2" / "__pycache__").iterdir())
    assert len(compiled) == 1 and compiled[0].startswith("model.") and compiled[0].endswith(".pyc")
    publish_version(repo, "kt", _files(tmp_path, "c"), "cfg changed")
    assert config.read_text() == "cfg changed"
    assert not (repo / "kt" / "3" / "__pycache__").exists()                   # no Python file, nothing compiled


def test_explicit_versions_and_duplicates(repo: Path, tmp_path: Path) -> None:
    assert publish_version(repo, "kt", _files(tmp_path, "a"), "cfg", version=7) == 7
    assert publish_version(repo, "kt", _files(tmp_path, "b"), "cfg") == 8
    before = _snapshot(repo)
    with pytest.raises(UserError, match="already has version 7"):
        publish_version(repo, "kt", _files(tmp_path, "c"), "cfg2", version=7)
    assert _snapshot(repo) == before
    with pytest.raises(UserError, match="positive integer"):
        publish_version(repo, "kt", _files(tmp_path, "c"), "cfg2", version=0)


def test_a_version_that_would_be_pruned_at_once_is_refused(repo: Path, tmp_path: Path) -> None:
    for version in (5, 6, 7):
        publish_version(repo, "kt", _files(tmp_path, "x"), "cfg", version=version, keep_versions=3)
    before = _snapshot(repo)
    with pytest.raises(UserError, match="older than"):
        publish_version(repo, "kt", _files(tmp_path, "old"), "cfg", version=2, keep_versions=2)
    assert _snapshot(repo) == before


@pytest.mark.parametrize("existing", [False, True])
def test_failure_during_staging_leaves_the_repository_untouched(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool) -> None:
    if existing:
        publish_version(repo, "kt", _files(tmp_path, "a"), "cfg a")
    before = _snapshot(repo)
    calls = []
    real_copy = shutil.copyfile

    def failing_copy(src, dst, *args, **kwargs):
        calls.append(dst)
        real_copy(src, dst, *args, **kwargs)           # half of the version exists in staging...
        raise OSError(28, "No space left on device")   # ...then the disk fills up

    monkeypatch.setattr(repo_mod.shutil, "copyfile", failing_copy)
    with pytest.raises(OSError, match="No space left"):
        publish_version(repo, "kt", _files(tmp_path, "b"), "cfg b")
    assert calls, "the injected failure did not run"
    assert _snapshot(repo) == before
    assert list_versions(repo, "kt") == ([1] if existing else [])


def test_failure_when_moving_into_place_leaves_the_repository_untouched(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    publish_version(repo, "kt", _files(tmp_path, "a"), "cfg a")
    before = _snapshot(repo)

    def failing_rename(src, dst):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(repo_mod.os, "rename", failing_rename)
    with pytest.raises(UserError, match="one filesystem"):
        publish_version(repo, "kt", _files(tmp_path, "b"), "cfg b")
    monkeypatch.undo()
    assert _snapshot(repo) == before


def test_repository_path_that_is_a_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "model_repository"
    path.write_text("not a folder")
    with pytest.raises(UserError, match="repository path .* is a file"):
        publish_version(path, "kt", _files(tmp_path, "a"), "cfg")
    assert path.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_repository", "src-a.onnx"]


@pytest.mark.parametrize("name", ["", "a/b", "..", ".hidden", "bad name", "mödel", "x;y"])
def test_bad_model_names_are_refused(repo: Path, tmp_path: Path, name: str) -> None:
    before = _snapshot(repo)
    with pytest.raises(UserError, match="model name"):
        publish_version(repo, name, _files(tmp_path, "a"), "cfg")
    assert _snapshot(repo) == before


def test_bad_files_are_refused(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="plain name"):
        publish_version(repo, "kt", {"../model.onnx": b"x"}, "cfg")
    with pytest.raises(UserError, match="not a file"):
        publish_version(repo, "kt", {ONNX_FILE: tmp_path / "missing.onnx"}, "cfg")
    with pytest.raises(UserError, match="keep_versions"):
        publish_version(repo, "kt", {ONNX_FILE: b"x"}, "cfg", keep_versions=0)
    assert list_models(repo) == []


def test_readme_is_never_touched(repo: Path, tmp_path: Path) -> None:
    readme = repo / "README.md"
    stat = readme.stat()
    for i in range(5):
        publish_version(repo, "kt", _files(tmp_path, str(i)), "cfg", keep_versions=2)
        publish_version(repo, "other", _files(tmp_path, str(i)), "cfg", keep_versions=1)
    assert readme.read_text() == README_TEXT
    assert readme.stat().st_mtime_ns == stat.st_mtime_ns and readme.stat().st_ino == stat.st_ino
    assert list_models(repo) == ["kt", "other"]


def test_listing_follows_tritons_version_rules(repo: Path) -> None:
    model = repo / "kt"
    for name in ["1", "2", "10", "007", "0", "latest", ".staging"]:
        (model / name).mkdir(parents=True)
    (model / "3").write_text("a file, not a version")
    assert list_versions(repo, "kt") == [1, 2, 10]
    assert latest_version(repo, "kt") == 10
    assert list_models(repo) == []                         # no config.pbtxt yet
    (model / CONFIG_FILE).write_text("cfg")
    assert list_models(repo) == ["kt"]
    assert list_versions(repo, "absent") == [] and latest_version(repo, "absent") is None
    assert list_models(repo / "nowhere") == []


def test_read_model_info_errors(repo: Path, tmp_path: Path) -> None:
    publish_version(repo, "kt", {ONNX_FILE: b"x", INFO_FILE: b"[1, 2]"}, "cfg")
    with pytest.raises(UserError, match="JSON object"):
        read_model_info(repo, "kt", 1)
    with pytest.raises(UserError, match="no model_info.json"):
        read_model_info(repo, "kt", 2)


def test_concurrent_publishers_get_distinct_versions(repo: Path, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    files = _files(tmp_path, "c")
    with ThreadPoolExecutor(max_workers=4) as pool:
        versions = list(pool.map(lambda i: publish_version(repo, "kt", files, f"cfg {i}", keep_versions=10),
                                 range(8)))
    assert sorted(versions) == list(range(1, 9))
    assert list_versions(repo, "kt") == list(range(1, 9))


def test_versions_the_rollout_policy_names_are_never_pruned(repo: Path, tmp_path: Path) -> None:
    """A canary 1 -> 2 stays whole while newer versions are published (the nightly loop's second night)."""
    for i in range(1, 6):
        publish_version(repo, "kt", _files(tmp_path, str(i)), "cfg", keep_versions=2, protected={1, 2})
    assert list_versions(repo, "kt") == [1, 2, 4, 5]
    publish_version(repo, "kt", _files(tmp_path, "6"), "cfg", keep_versions=2, protected={5})
    assert list_versions(repo, "kt") == [5, 6]                  # no longer named: pruned as usual
