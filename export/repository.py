"""The generated Triton model repository: publish model versions atomically, list and read them.

Layout (file names from routerkt/contract/signature.py; reading it: routerkt/contract/repository_reader.py):

    <repository>/README.md                      committed, never touched here
    <repository>/<name>/config.pbtxt
    <repository>/<name>/<version>/{model.onnx | model.plan, model.py, vocab.json, model_info.json}

A version folder is built completely in a staging directory NEXT TO the repository (same
filesystem, so the final `os.rename` is atomic, and outside it, so Triton never sees a half-written
folder), fsynced, then renamed into place. A brand-new model is staged as a whole (config.pbtxt and
its first version) and appears in one rename. For an existing model, config.pbtxt is replaced
(temp file + os.replace) after the new version folder is in place, only when its text changed.
Python files of a version are byte-compiled in staging: Triton's Python stub would otherwise write
`__pycache__` into the served folder when it first imports model.py. Old versions beyond
`keep_versions`, unless protected (named by the rollout policy), are then moved out of the repository
(one rename) and deleted there.
Triton only considers version folders whose names are positive integers without leading zeros.
"""
from __future__ import annotations

import compileall
import errno
import fcntl
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from routerkt.atomic import atomic_write_bytes
from routerkt.contract.repository_reader import list_versions
from routerkt.contract.signature import CONFIG_FILE
from routerkt.errors import UserError

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def publish_version(repository: Path, name: str, files: dict[str, Path | bytes], config_text: str,
                    version: int | None = None, keep_versions: int = 3, protected: Iterable[int] = ()) -> int:
    """Add version `version` (None: latest + 1, or 1 for a new model) of model `name`, holding
    `files` (file name -> source path or content), with `config_text` as its config.pbtxt.
    Older versions beyond the newest `keep_versions` are pruned, except the `protected` ones (the
    versions the rollout policy names: routerkt/contract/rollout_versions.py). Returns the version
    number. Raises UserError for bad input, touching nothing."""
    repository = Path(repository)
    _check_name(name)
    _check_files(files)
    if keep_versions < 1:
        raise UserError(f"keep_versions must be >= 1, got {keep_versions}")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise UserError(f"model version must be a positive integer, got {version!r}")
    _prepare_repository(repository)
    model_dir = repository / name
    if model_dir.exists() and not model_dir.is_dir():
        raise UserError(f"{model_dir} exists and is not a model folder")

    with _locked(repository):
        existing = list_versions(repository, name)
        if version is None:
            version = (existing[-1] + 1) if existing else 1
        elif version in existing:
            raise UserError(f"model {name!r} already has version {version} in {repository}")
        kept = sorted(set(sorted(existing + [version])[-keep_versions:]) | (set(protected) & set(existing)))
        if version not in kept:
            raise UserError(f"version {version} of {name!r} is older than the {keep_versions} versions "
                            f"kept ({kept}); it would be deleted at once")

        staging = _staging_dir(repository)
        try:
            if model_dir.is_dir():
                version_dir = staging / str(version)
                _write_version(version_dir, files)
                _rename(version_dir, model_dir / str(version))
                _fsync_dir(model_dir)
                if _read_or_none(model_dir / CONFIG_FILE) != config_text.encode():
                    # an unchanged config is left alone: a rewrite makes Triton reload every version
                    atomic_write_bytes(model_dir / CONFIG_FILE, config_text.encode())
            else:                          # a new model appears complete, in one rename
                new_model = staging / name
                new_model.mkdir()
                _write_version(new_model / str(version), files)
                atomic_write_bytes(new_model / CONFIG_FILE, config_text.encode())
                _rename(new_model, model_dir)
                _fsync_dir(repository)
            for old in sorted(set(existing) - set(kept)):
                os.rename(model_dir / str(old), staging / f"old-{old}")
            _fsync_dir(model_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return version


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("."):
        raise UserError(f"model name {name!r} must match [A-Za-z0-9_.-]+ and not start with '.'")


def _check_files(files: dict[str, Path | bytes]) -> None:
    if not files:
        raise UserError("a model version needs at least one file")
    for file_name, source in files.items():
        if not _NAME.fullmatch(file_name) or file_name.startswith("."):
            raise UserError(f"file name {file_name!r} in a version folder must be a plain name")
        if isinstance(source, (bytes, bytearray)):
            continue
        if not isinstance(source, (str, os.PathLike)) or not Path(source).is_file():
            raise UserError(f"source for {file_name!r} is not a file: {source}")


def _prepare_repository(repository: Path) -> None:
    if repository.exists() and not repository.is_dir():
        raise UserError(f"repository path {repository} is a file, not a folder")
    try:
        repository.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create repository {repository}: {exc.strerror}") from None


def _staging_dir(repository: Path) -> Path:
    """A fresh hidden folder beside the repository (same filesystem, invisible to Triton)."""
    real = repository.resolve()
    try:
        return Path(tempfile.mkdtemp(prefix=f".{real.name}.staging-", dir=real.parent))
    except OSError as exc:
        raise UserError(f"cannot create a staging folder in {real.parent} (next to the repository): "
                        f"{exc.strerror}") from None


@contextmanager
def _locked(repository: Path) -> Iterator[None]:
    """Serialise publishers of one repository: an flock on the folder itself (no lock file)."""
    fd = os.open(repository, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                 # closing releases the lock


def _write_version(version_dir: Path, files: dict[str, Path | bytes]) -> None:
    version_dir.mkdir()
    for file_name, source in files.items():
        target = version_dir / file_name
        if isinstance(source, (bytes, bytearray)):
            target.write_bytes(source)
        else:
            shutil.copyfile(source, target)
        _fsync_file(target)
    if any(name.endswith(".py") for name in files):
        compileall.compile_dir(str(version_dir), quiet=1, maxlevels=0)
    _fsync_dir(version_dir)




def _rename(source: Path, target: Path) -> None:
    try:
        os.rename(source, target)
    except OSError as exc:
        hint = (" (the repository and its parent folder must be on one filesystem)"
                if exc.errno == errno.EXDEV else "")
        raise UserError(f"cannot move the staged {target.name!r} into {target.parent}: "
                        f"{exc.strerror}{hint}") from None


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
