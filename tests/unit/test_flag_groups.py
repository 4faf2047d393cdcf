"""routerkt/flag_groups.py: the store-credential and client flags, declared once, read the same in every command."""
from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from routerkt import flag_groups
from routerkt.flag_groups import Store, Switch, given

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("--store-password-file", "--store-ca-file", "--api-key-file", "--tls-ca", "--gateway-ca-file")


def helps(module: str) -> dict[str, str]:
    """flag -> help text on the real parser of a `routerkt` command module."""
    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    return {flag: action.help for action in parser._actions for flag in action.option_strings}


def test_no_command_declares_a_shared_flag_itself() -> None:
    pattern = re.compile(r"""add_argument\(\s*["'](%s)["']""" % "|".join(map(re.escape, SHARED)))
    folders = ("routerkt", "serving", "export", "training", "loadtest")
    declaring = sorted(str(path.relative_to(ROOT)) for folder in folders for path in (ROOT / folder).rglob("*.py")
                       if pattern.search(path.read_text()))
    assert declaring == ["routerkt/flag_groups.py"], declaring


def test_every_command_shows_the_same_store_and_client_flags() -> None:
    store = [helps(m) for m in ("serving.cli.cli_serve", "loop.cli_retrain", "serving.sessions.cli_sessions_export",
                                "serving.sessions.cli_sessions_import")]
    for flag in ("--store-password-file", "--store-ca-file"):
        assert len({h[flag] for h in store}) == 1, flag
    predict, retrain = helps("serving.cli.cli_predict"), helps("loop.cli_retrain")
    assert predict["--api-key-file"] == retrain["--api-key-file"]
    assert predict["--tls-ca"] == retrain["--gateway-ca-file"] and "--tls-ca" not in retrain


def test_the_default_key_named_is_the_one_serve_makes() -> None:
    from serving.security.client_flags import ENV_KEY
    from serving.security.default_keys import DEFAULT_STATE_DIR, TOKEN_FILE
    assert flag_groups.DEFAULT_ADMIN_KEY == DEFAULT_STATE_DIR / TOKEN_FILE and ENV_KEY == flag_groups.API_KEY_ENV


def test_given_names_only_the_flags_on_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=5, action=Store)
    parser.add_argument("--name", default="x", action=Store)
    parser.add_argument("--cache", default=True, action=Switch)
    assert given(parser.parse_args([])) == frozenset()
    args = parser.parse_args(["--port", "5", "--no-cache"])
    assert given(args) == {"port", "cache"} and (args.port, args.name, args.cache) == (5, "x", False)
