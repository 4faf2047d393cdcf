"""`routerkt serve --config`: every Settings field from the file, given flags over it, one-line errors, frozen."""
from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

from routerkt.cli import main
from routerkt.errors import UserError
from serving.cli import cli_serve, serve_flags
from serving.cli.serve_config import ServeOptions, merged, read_config
from serving.settings import Settings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HINTS = typing.get_type_hints(Settings)


def serve_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="routerkt serve")
    cli_serve.add_arguments(parser)
    return parser.parse_args(argv)


def write(folder: Path, text: str, name: str = "serve.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def _other_value(name: str, default: object) -> tuple[str, object]:
    """(TOML text, the value expected in Settings, relative paths not yet joined) differing from the default."""
    hint = HINTS[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if hint is bool:
        return ("false" if default else "true"), not default
    if hint is int:
        value = (default or 0) + 1
        return str(value), value
    if hint is float:
        return repr(default + 0.5), default + 0.5
    if hint is str:
        return f'"{default}-changed"', f"{default}-changed"
    if hint is Path:
        return f'"files/{name}"', Path("files") / name
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[0] is str:
        return '["10.9.8.7"]', ("10.9.8.7",)
    pytest.fail(f"Settings.{name}: a type ({hint}) this test (and the --config reader) has no file form for")


def test_every_settings_field_can_be_set_from_the_file_and_no_flag_default_overrides_it(tmp_path: Path) -> None:
    """One key per Settings field, each a non-default value, through the real serve parser with only
    --config given: each lands in Settings (a new field of a type the file cannot express fails here)."""
    defaults = Settings()
    lines, expected = [], {}
    for field in dataclasses.fields(Settings):
        text, value = _other_value(field.name, getattr(defaults, field.name))
        lines.append(f"{field.name} = {text}")
        expected[field.name] = tmp_path / value if isinstance(value, Path) else value
    config = write(tmp_path, "\n".join(lines) + "\n")
    chosen, _ = merged(serve_args(["--config", str(config)]))
    settings = Settings(**chosen)
    assert set(chosen) == {f.name for f in dataclasses.fields(Settings)}
    for name, value in expected.items():
        assert getattr(settings, name) == value != getattr(defaults, name), name


def test_every_serve_option_can_be_set_from_the_serve_table(tmp_path: Path) -> None:
    config = write(tmp_path, '[serve]\nstate_dir = "st"\nstore = "none"\nstore_secret_file = "s"\n'
                             'store_password_file = "p"\nstore_ca_file = "/etc/ca.pem"\nstore_wait = true\n'
                             'sample_model = "kt"\ntriton_log = "t.log"\nlog_format = "json"\n')
    _, options = merged(serve_args(["--config", str(config)]))
    assert options == ServeOptions(state_dir=tmp_path / "st", store="none", store_secret_file=tmp_path / "s",
                                   store_password_file=tmp_path / "p", store_ca_file=Path("/etc/ca.pem"),
                                   store_wait=True, sample_model="kt", triton_log=tmp_path / "t.log",
                                   log_format="json")
    assert {f.name for f in dataclasses.fields(ServeOptions)} == set(serve_flags.SERVE_ONLY) - {"config"}


def test_flags_given_override_the_file_and_only_those(tmp_path: Path) -> None:
    (tmp_path / "conf" / "models").mkdir(parents=True)
    config = write(tmp_path / "conf", 'repository = "models"\nmax_inflight = 8\ngrace_period_s = 3\n'
                                      'grpc_port = 6000\nprefix_cache = true\nhttp_port = 9000\n'
                                      'rollout_policy = "policy.json"\nauth_failure_per_s = 4\n'
                                      'trusted_proxies = ["10.0.0.1"]\n'
                                      '[serve]\nstate_dir = "state"\nstore = "sqlite:///x.sqlite3"\n')
    settings, options, external = cli_serve.resolve(serve_args([
        "--config", str(config), "--max-inflight", "16", "--grpc-port", "50051", "--no-prefix-cache",
        "--http-port", "-1", "--store", "none", "--auth-failure-rate", "2", "--insecure"]))
    assert (settings.max_inflight, settings.grpc_port, settings.prefix_cache, settings.http_port) == (16, 50051, False,
                                                                                                      None)
    assert settings.auth_failure_per_s == 2.0                  # the former flag name still sets it
    assert settings.grace_period_s == 3.0 and settings.trusted_proxies == ("10.0.0.1",)   # not given: the file's
    assert settings.repository == tmp_path / "conf" / "models"
    assert settings.rollout_policy == tmp_path / "conf" / "policy.json"           # the file's, not the state dir's
    assert options.state_dir == tmp_path / "conf" / "state" and options.store == "none"
    assert settings.api_keys is None and settings.insecure and not external
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_inflight = 3                                                     # type: ignore[misc]


def test_serve_decides_its_defaults_for_what_no_one_chose(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    settings, options, external = cli_serve.resolve(serve_args([
        "--repository", str(tmp_path / "repo"), "--state-dir", str(tmp_path / "state"), "--triton-url", "h:1"]))
    assert settings.rollout_policy == tmp_path / "state" / "rollout.json" and external
    assert settings.api_keys == tmp_path / "state" / "keys.jsonl"                # loopback: keys on by default
    assert settings.triton_url == "h:1" and options.store is None


@pytest.mark.parametrize("text, message", [
    ("max_inflite = 3\n", "unknown key max_inflite (did you mean max_inflight?)"),
    ("zzz_qqq = 3\n", "unknown key zzz_qqq; the keys are Settings fields"),
    ("state_dir = 'x'\n", "unknown key state_dir (a serve option: put it under [serve])"),
    ("[serve]\nmax_inflight = 3\n", "unknown key serve.max_inflight (a Settings field"),
    ("[serve]\nstate_dri = 'x'\n", "unknown key serve.state_dri (did you mean serve.state_dir?)"),
    ("[server]\nstore = 'none'\n", "unknown key server (did you mean serve?)"),
    ("serve = 3\n", "[serve] must be a table, got an integer"),
    ("max_inflight = '16'\n", "max_inflight must be an integer, got a string '16'"),
    ("http_port = true\n", "http_port must be an integer, got a boolean True"),
    ("grace_period_s = 'long'\n", "grace_period_s must be a number, got a string"),
    ("prefix_cache = 1\n", "prefix_cache must be true or false, got an integer 1"),
    ("tls_cert = 5\n", "tls_cert must be a path (a non-empty string), got an integer"),
    ("trusted_proxies = '10.0.0.1'\n", "trusted_proxies must be a list of strings, got a string"),
    ("[serve]\nstore_wait = 'yes'\n", "serve.store_wait must be true or false"),
    ("[serve]\nlog_format = 'xml'\n", "serve.log_format must be one of auto, json, plain"),
    ("max_inflight = \n", "not valid TOML"),
    ("repository = '.'\nmax_inflight = 0\n", "settings.max_inflight must be a positive integer"),
    ("repository = '.'\nmax_candidates = 300\n", "settings.max_rows_per_infer (256) must be >= max_candidates"),
    ("max_inflight = 3\n", "needs a model repository"),
])
def test_a_bad_file_is_one_line_naming_the_key_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, text: str,
                                                       message: str) -> None:
    config = write(tmp_path, text)
    assert main(["serve", "--config", str(config), "--state-dir", str(tmp_path / "state")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "state").exists()                  # refused before any file is made


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--config .*nothing\.toml: cannot read it"):
        read_config(tmp_path / "nothing.toml")


def test_every_serve_flag_sets_a_settings_field_or_a_serve_option() -> None:
    parser = argparse.ArgumentParser()
    cli_serve.add_arguments(parser)
    fields = {f.name for f in dataclasses.fields(Settings)}
    dests = {action.dest for action in parser._actions if action.option_strings and action.dest != "help"}
    assert all(serve_flags.FIELD_OF.get(dest, dest) in fields or dest in serve_flags.SERVE_ONLY for dest in dests)
    assert len(dests & fields) + len(serve_flags.FIELD_OF) >= 30


def test_the_docs_example_has_every_key_and_validates(tmp_path: Path) -> None:
    """docs/configuration.md's whole file: every Settings field and serve option (set, or commented
    out where none is the default), values as the defaults, and it loads and validates."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    (example,) = re.findall(r"```toml\n(.*?)```", page, flags=re.S)
    named = set(re.findall(r"^#? ?([a-z_]+) = ", example, flags=re.M))
    assert named == {f.name for f in dataclasses.fields(Settings)} | {f.name for f in dataclasses.fields(ServeOptions)}
    (tmp_path / "model_repository").mkdir()
    settings, serve = read_config(write(tmp_path, example))
    loaded = Settings(**settings).validate()
    ServeOptions(**serve).validate()
    defaults = Settings()
    for name in settings:
        value = getattr(loaded, name)
        shown = value.relative_to(tmp_path) if isinstance(value, Path) else value
        assert shown == getattr(defaults, name), f"docs/configuration.md shows {name} = {shown!r}, not the default"
    assert "triton_url" not in settings                       # present, it would stop serve starting Triton


def test_settings_are_frozen_and_normalised_at_construction() -> None:
    settings = Settings(repository="repo", tls_cert="c.pem", tls_key="k.pem", trusted_proxies=" 10.0.0.7 ,10.0.0.0/8")
    assert settings.repository == Path("repo") and settings.tls_cert == Path("c.pem")
    assert settings.validate() is settings and settings.trusted_proxies == ("10.0.0.7", "10.0.0.0/8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.triton_url = "h:2"                                                   # type: ignore[misc]
    changed = dataclasses.replace(settings, triton_url="h:2", trusted_proxies=["10.0.0.8"]).validate()
    assert (changed.triton_url, changed.trusted_proxies) == ("h:2", ("10.0.0.8",))
    assert settings.triton_url == "127.0.0.1:8001"                                    # the original is as it was


def test_the_url_of_the_triton_serve_starts_validates() -> None:
    """run() puts the started Triton's unix: URL in with dataclasses.replace(...).validate()."""
    from serving.tritonserver.command import socket_path
    url = f"unix:{socket_path(Path('/tmp/routerkt-x'), 8001)}"
    assert Settings(triton_url=url).validate().triton_urls == [url]
