"""routerkt/cli.py: an explicit argv never replaces the calling process (the console entry alone
re-executes training commands with the malloc setting). A re-exec inside pytest would end the
test session early with the re-executed command's exit code: a silent, partial "pass"."""
from __future__ import annotations

import os

import pytest

from routerkt import cli, memory

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("command", sorted(memory.TRAINING_COMMANDS))
def test_an_explicit_argv_never_re_executes(command, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("os.execve called")
    monkeypatch.setattr(os, "execve", refuse)
    monkeypatch.delenv("ROUTERKT_NO_REEXEC", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "")
    with pytest.raises(SystemExit) as info:
        cli.main([*command.split(), "--no-such-flag"])
    assert info.value.code == 2


def test_the_console_entry_re_executes_training_commands(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(os, "execve", lambda *args: calls.append(args) or (_ for _ in ()).throw(SystemExit(0)))
    monkeypatch.delenv("ROUTERKT_NO_REEXEC", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "")
    monkeypatch.setattr("sys.argv", ["routerkt", "train", "--help"])
    with pytest.raises(SystemExit):
        cli.main()
    assert calls and calls[0][2]["GLIBC_TUNABLES"].endswith(memory.MALLOC_TUNABLE)
