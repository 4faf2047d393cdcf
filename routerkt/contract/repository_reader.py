"""Reading the Triton model repository: models, versions, and each version's artifacts.

Layout (file names from routerkt/contract/signature.py):

    <repository>/<name>/config.pbtxt
    <repository>/<name>/<version>/{model.onnx | model.plan, model.py, vocab.json, model_info.json}

Triton only considers version folders whose names are positive integers without leading zeros;
so do these readers. Writing (atomic publishing, pruning) is export's job (export/repository.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from routerkt.contract.model_info import ModelInfo
from routerkt.contract.signature import CONFIG_FILE, INFO_FILE, VOCAB_FILE
from routerkt.contract.vocab import Vocab
from routerkt.errors import UserError

VERSION_NAME = re.compile(r"[1-9][0-9]*")


def list_models(repository: Path) -> list[str]:
    """Names of the models in the repository (folders holding a config.pbtxt), sorted."""
    repository = Path(repository)
    if not repository.is_dir():
        return []
    return sorted(p.name for p in repository.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / CONFIG_FILE).is_file())


def list_versions(repository: Path, name: str) -> list[int]:
    """Version numbers of model `name` that Triton would consider, ascending ([] if none)."""
    model_dir = Path(repository) / name
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and VERSION_NAME.fullmatch(p.name))


def latest_version(repository: Path, name: str) -> int | None:
    versions = list_versions(repository, name)
    return versions[-1] if versions else None


def version_dir(repository: Path, name: str, version: int) -> Path:
    return Path(repository) / name / str(version)


def read_model_info(repository: Path, name: str, version: int) -> ModelInfo:
    """The model_info.json of one version; ModelInfoError (a UserError) when missing or malformed."""
    path = version_dir(repository, name, version) / INFO_FILE
    if not path.is_file():
        raise UserError(f"no {INFO_FILE} for model {name!r} version {version} in {repository}")
    return ModelInfo.load(path)


def read_vocab(repository: Path, name: str, version: int) -> Vocab:
    """The vocab.json of one version; VocabError (a UserError) when missing or malformed."""
    return Vocab.load(version_dir(repository, name, version) / VOCAB_FILE)


@dataclass(frozen=True)
class ServedShape:
    """What the gateway needs from a model's config.pbtxt."""

    max_batch_size: int                      # rows per Triton request
    input_names: tuple[str, ...]
    input_dims: tuple[tuple[int, ...], ...]  # dims of each input, without the batch axis
    output_names: tuple[str, ...] = ()       # rank + explain outputs: the model also serves the explain graph


def parse_triton_config(text: str):
    """Parse config.pbtxt text (comments allowed) into Triton's ModelConfig; UserError when malformed."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise UserError(f"invalid config.pbtxt: {str(exc).splitlines()[0]}") from None
    return config


def read_served_shape(repository: Path, name: str) -> ServedShape:
    """max_batch_size and input dims of a model's config.pbtxt; UserError when unreadable."""
    path = Path(repository) / name / CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    config = parse_triton_config(text)
    return ServedShape(max_batch_size=int(config.max_batch_size), input_names=tuple(t.name for t in config.input),
                       input_dims=tuple(tuple(int(d) for d in t.dims) for t in config.input),
                       output_names=tuple(t.name for t in config.output))
