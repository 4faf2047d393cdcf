"""`routerkt predict` / `routerkt serve` flag handling (no server needed) and Settings validation."""
from __future__ import annotations

import json
import logging

import pytest

from routerkt.cli import main
from routerkt.errors import UserError
from serving.cli.cli_predict import parse_candidates, parse_history
from serving.logs import JsonFormatter
from serving.settings import Settings

pytestmark = pytest.mark.unit


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:                # argparse errors
        return int(exc.code)


def test_parse_history_and_candidates() -> None:
    assert parse_history("1:2:1, 3::0,4:-1:1") == [(1, 2, 1), (3, None, 0), (4, -1, 1)]
    assert parse_history("") == []
    assert parse_candidates("5,6:7, 8:") == [(5, None), (6, 7), (8, None)]


def test_skill_sets_on_the_command_line() -> None:
    import argparse

    from serving.cli.cli_predict import add_arguments, build_request
    assert parse_history("1:3;17:1,2:4:0") == [(1, [3, 17], 1), (2, 4, 0)]
    assert parse_candidates("5:6;7,8") == [(5, [6, 7]), (8, None)]
    parser = argparse.ArgumentParser()
    add_arguments(parser)                                    # the real `routerkt predict` flags
    args = parser.parse_args(["--target", "h:1", "--model", "kt", "--history", "1:3;17:1",
                              "--candidates", "5:6;7,8:9", "--timeout", "1"])
    request = build_request(args)
    assert list(request.history[0].skill_ids) == [3, 17] and not request.history[0].HasField("skill_id")
    assert list(request.candidates[0].skill_ids) == [6, 7] and request.candidates[1].skill_id == 9
    with pytest.raises(UserError, match="--history item 1 skill"):
        parse_history("1:3;x:1")


@pytest.mark.parametrize("text", ["1:2", "1:2:3:4", "a:1:1", "1:x:0"])
def test_bad_history_items(text: str) -> None:
    with pytest.raises(UserError, match="--history item 1"):
        parse_history(text)


@pytest.mark.parametrize("text", ["", "1:2:3", "q"])
def test_bad_candidates(text: str) -> None:
    with pytest.raises(UserError, match="--candidates"):
        parse_candidates(text)


@pytest.mark.parametrize("argv", [
    ["predict", "--candidates", "1"],                                        # no --model
    ["predict", "--model", "kt"],                                            # no --candidates
    ["predict", "--model", "kt", "--candidates", "1", "--version", "x"],
    ["predict", "--model", "kt", "--candidates", "1", "--bogus"],
    ["predict", "--model", "kt", "--candidates", "1:2:3"],
    ["predict", "--model", "kt", "--candidates", "1", "--history", "1:2"],
    ["predict", "--model", "kt", "--candidates", "1", "--timeout", "0"],
    ["predict", "--model", "kt", "--candidates", "1", "--target", "nohostport"],
    ["serve"],                                                               # no --repository
    ["serve", "--repository", "/nonexistent/repository"],
    ["serve", "--repository", ".", "--grpc-port", "99999"],
])
def test_bad_flags_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err, err


def test_settings_validation_names_the_field() -> None:
    Settings().validate()
    for kwargs, field in (({"max_inflight": 0}, "max_inflight"), ({"grpc_port": -1}, "grpc_port"),
                          ({"default_deadline_s": 0}, "default_deadline_s"), ({"triton_url": "x"}, "triton_url"),
                          ({"max_candidates": 300}, "max_rows_per_infer"), ({"grace_period_s": -1}, "grace_period_s"),
                          ({"max_queued": -1}, "max_queued"), ({"inflight_wait_s": -0.5}, "inflight_wait_s"),
                          ({"bulk_pause_ratio": -1}, "bulk_pause_ratio")):
        with pytest.raises(UserError, match=field):
            Settings(**kwargs).validate()


def test_json_log_lines() -> None:
    record = logging.LogRecord("routerkt.gateway", logging.INFO, __file__, 1, "gRPC on %s", ("127.0.0.1:1",), None)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "gRPC on 127.0.0.1:1" and entry["level"] == "info" and entry["logger"] == "routerkt.gateway"


def test_start_up_log_names_https_when_tls_is_on(tmp_path) -> None:
    """The "gateway HTTP:" / metrics log lines of `routerkt serve` say https:// with TLS on."""
    from serving.cli.cli_serve import http_base
    from serving.settings import Settings
    assert http_base(Settings(), 8080) == "http://127.0.0.1:8080"
    assert http_base(Settings(tls_cert=tmp_path / "c", tls_key=tmp_path / "k", host="0.0.0.0"), 8443) == \
        "https://0.0.0.0:8443"
    assert http_base(Settings(host="::1"), 80) == "http://[::1]:80"
