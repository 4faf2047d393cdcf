"""serving/security/default_keys.py: the private state folder and the admin key of a loopback gateway."""
from __future__ import annotations

import os

import pytest

from serving.security.api_keys import KeyFile
from serving.security.default_keys import ADMIN_ID, default_keys, default_token, private_dir
from serving.security.scopes import SCOPES

pytestmark = pytest.mark.unit


def test_the_state_folder_is_made_private(tmp_path) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    assert private_dir(folder).stat().st_mode & 0o777 == 0o700
    assert private_dir(tmp_path / "new" / "state").stat().st_mode & 0o777 == 0o700


def test_the_admin_key_opens_every_scope_and_stays_across_starts(tmp_path) -> None:
    keys = default_keys(tmp_path / "state")
    token = default_token(tmp_path / "state")
    key = KeyFile(keys).lookup(token)
    assert key is not None and key.key_id == ADMIN_ID and key.scopes == frozenset(SCOPES)
    for name in ("keys.jsonl", "admin.key"):
        assert (tmp_path / "state" / name).stat().st_mode & 0o777 == 0o600
    assert default_keys(tmp_path / "state") == keys and default_token(tmp_path / "state") == token   # kept


def test_a_lost_admin_key_is_replaced_and_the_old_one_revoked(tmp_path) -> None:
    keys = default_keys(tmp_path / "state")
    old = default_token(tmp_path / "state")
    (tmp_path / "state" / "admin.key").unlink()
    default_keys(tmp_path / "state")
    new = default_token(tmp_path / "state")
    assert new != old
    assert KeyFile(keys).lookup(old) is None and KeyFile(keys).lookup(new) is not None
    assert default_token(tmp_path / "elsewhere") is None
