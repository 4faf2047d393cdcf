"""`routerkt serve --config FILE`: TOML setting every Settings field and the [serve] options; given flags win."""
from __future__ import annotations

import argparse
import difflib
import tomllib
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path

from routerkt.errors import UserError
from serving.cli.serve_flags import LOG_FORMATS, given_values
from serving.settings import Settings

SERVE_TABLE = "serve"


@dataclass(frozen=True)
class ServeOptions:
    """What `routerkt serve` needs besides Settings: its flags of the same names, the file's [serve] table."""

    state_dir: Path = Path(".routerkt")        # the serving state folder (SQLite store, secrets, keys, rollout.json)
    store: str | None = None                   # session store URL; None: sqlite:///<state_dir>/sessions.sqlite3;
                                               # "none": no sessions
    store_secret_file: Path | None = None      # HMAC secret of learner keys; None: <state_dir>/store.secret
    store_password_file: Path | None = None    # password of the redis(s):// store user
    store_ca_file: Path | None = None          # CA of the store's certificate (rediss://)
    store_wait: bool = False                   # start even when the store refuses the credentials, and wait
    sample_model: str | None = None            # once ready, one sample Predict with this model
    triton_log: Path | None = None             # Triton's log file (the Triton serve starts); None: a temp file
    log_format: str = "auto"                   # auto | json | plain

    def validate(self) -> "ServeOptions":
        if self.log_format not in LOG_FORMATS:
            raise UserError(f"serve.log_format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        return self

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{self.state_dir / 'sessions.sqlite3'}"


def merged(args: argparse.Namespace) -> tuple[dict[str, object], ServeOptions]:
    """(Settings fields chosen, serve options): the --config file's values, then the flags given over them.
    Settings fields no one chose are left out (Settings' defaults apply; serve decides a few itself)."""
    settings, serve = read_config(args.config) if args.config is not None else ({}, {})
    flag_settings, flag_serve = given_values(args)
    return {**settings, **flag_settings}, ServeOptions(**{**serve, **flag_serve}).validate()


def read_config(path: Path) -> tuple[dict[str, object], dict[str, object]]:
    """(Settings fields, [serve] options) of a TOML file, typed; UserError (one line) naming a bad key.
    A relative path is relative to the file's folder."""
    path = Path(path)
    where = f"--config {path}"
    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except OSError as exc:
        raise UserError(f"{where}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where}: not valid TOML: {str(exc).splitlines()[0]}") from None
    serve = table.pop(SERVE_TABLE, {})
    if not isinstance(serve, dict):
        raise UserError(f"{where}: [{SERVE_TABLE}] must be a table, got {_kind(serve)}")
    settings_hints, serve_hints = _hints(Settings), _hints(ServeOptions)
    return (_typed(table, settings_hints, serve_hints, path.parent, where, ""),
            _typed(serve, serve_hints, settings_hints, path.parent, where, f"{SERVE_TABLE}."))


def _hints(cls: type) -> dict[str, object]:
    resolved = typing.get_type_hints(cls)
    return {f.name: resolved[f.name] for f in fields(cls)}


def _typed(table: dict, hints: dict[str, object], elsewhere: dict[str, object], base: Path, where: str,
           prefix: str) -> dict[str, object]:
    """The table's values typed by `hints`; UserError for a key not in them (`elsewhere`: the other table's)."""
    out = {}
    for key, value in table.items():
        if key not in hints:
            raise UserError(f"{where}: unknown key {prefix}{key}{_unknown_hint(key, hints, elsewhere, prefix)}")
        out[key] = _value(value, hints[key], base, f"{where}: {prefix}{key}")
    return out


def _unknown_hint(key: str, hints: dict[str, object], elsewhere: dict[str, object], prefix: str) -> str:
    if key in elsewhere:
        return (" (a Settings field: put it above any [table])" if prefix else
                f" (a serve option: put it under [{SERVE_TABLE}])")
    close = difflib.get_close_matches(key, list(hints) + ([] if prefix else [SERVE_TABLE]), n=1)
    if close:
        return f" (did you mean {prefix}{close[0]}?)"
    return (f"; [{SERVE_TABLE}] takes {', '.join(hints)}" if prefix else
            f"; the keys are Settings fields (serving/settings.py) and a [{SERVE_TABLE}] table "
            "(docs/configuration.md)")


def _value(value: object, hint: object, base: Path, name: str) -> object:
    """`value` as the field's type: Path from a string (relative: to `base`), tuple from a list, a float
    from an integer; an optional integer's -1 is None (http_port = -1: HTTP off, as --http-port -1)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if hint is int and type(value) is int and value == -1:
            return None
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, str):
        return value
    if hint is Path and isinstance(value, str) and value:
        return base / Path(value).expanduser()
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[0] is str and isinstance(value, list) \
            and all(isinstance(item, str) for item in value):
        return tuple(value)
    if hint not in EXPECTED and typing.get_origin(hint) is not tuple:
        raise TypeError(f"{name}: no file form for the type {hint}")      # a new field type: add it above
    expected = EXPECTED.get(hint, "a list of strings")
    raise UserError(f"{name} must be {expected}, got {_kind(value)} {_shown(value)}")


EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            Path: "a path (a non-empty string)"}


def _kind(value: object) -> str:
    """A TOML value's kind, as TOML names it."""
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"), (list, "an array"),
             (dict, "a table"))
    return next((kind for cls, kind in kinds if isinstance(value, cls)), "a date or time")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
