"""services/security/certs.py: the throwaway CA's files land whole in the folder they
are asked for, whatever filesystem that folder is on."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from services.security import certs


def test_files_are_moved_into_place_within_their_folder_never_across_filesystems(tmp_path, monkeypatch):
    """Found running docker-compose.tls.yml: its `certs` service writes into a
    volume, a filesystem of its own, and the rename from the temporary
    folder into it failed (EXDEV). Here the test's folder is such a volume:
    a rename into it from outside fails the way it does across filesystems."""
    rename = os.replace

    def on_one_filesystem(source, target):
        if Path(source).resolve().is_relative_to(tmp_path) != Path(target).resolve().is_relative_to(tmp_path):
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(source))
        rename(source, target)

    monkeypatch.setattr(os, "replace", on_one_filesystem)
    ca = certs.create_ca(tmp_path)
    cert, key = certs.issue(tmp_path, "partition-svc-0", server=True, hosts=("partition-svc-0", "127.0.0.1"))
    jwks = certs.create_token_key(tmp_path)
    token = certs.issue_token(tmp_path, "admin")
    assert ca.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert cert.read_text().startswith("-----BEGIN CERTIFICATE-----") and "PRIVATE KEY" in key.read_text()
    assert key.stat().st_mode & 0o777 == 0o600, "a key is readable by its owner only"
    assert jwks.exists() and token.read_text().count(".") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ca.pem", "ca-key.pem", "partition-svc-0.pem", "partition-svc-0-key.pem", "token-signing-key.pem", "jwks.json",
         "admin.token"]), "nothing left behind"
