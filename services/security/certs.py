"""A throwaway certificate authority for local clusters (``txlog cluster up
--tls``, ``txlog tls issue``), made with the openssl command (Debian's
``openssl`` package). Not for production: there, certificates come from the
operator's CA or cert-manager.

Layout under a cluster's ``tls/`` folder: ``ca.pem`` and ``ca-key.pem``; for
each name, ``NAME.pem`` and ``NAME-key.pem`` with subject ``CN=NAME`` (the
default principal mapping makes it ``User:NAME``). Keys are EC P-256,
readable by their owner only.

Bearer tokens (services/security/tokens.py) for clusters that authenticate callers by
token rather than certificate: ``token-signing-key.pem`` (RSA 2048) and its
public half as ``jwks.json``, the file servers verify with; ``NAME.token``
is a JWT for ``User:NAME`` signed with it (RS256, issuer ``txlog-local``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from services.security.tokens import b64url_encode

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
VALID_DAYS = 365


class CertificateError(RuntimeError):
    pass


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    if shutil.which("openssl") is None:
        raise CertificateError("the openssl command is missing; install it: apt-get install -y openssl")
    done = subprocess.run(["openssl", *args], capture_output=True, input=stdin)
    if done.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {done.stderr.decode(errors='replace').strip()[-500:]}")
    return done.stdout


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def create_ca(directory: Path) -> Path:
    """``directory/ca.pem`` (and its key), made once; the CA's path."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, key = directory / "ca.pem", directory / "ca-key.pem"
    if not ca.exists():
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
                 "-out", str(ca), "-days", str(VALID_DAYS), "-subj", "/CN=txlog local CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        _private(key)
    return ca


def issue(directory: Path, name: str, *, server: bool = False, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
          common_name: str | None = None) -> tuple[Path, Path]:
    """A certificate for ``CN=<common_name, by default name>`` signed by the
    CA in ``directory``, in ``name.pem`` and ``name-key.pem``: for a client,
    or (``server``) for an instance that also serves ``hosts``. Returns
    (certificate, key) paths; an existing pair is replaced."""
    if not NAME.fullmatch(name):
        raise CertificateError(f"certificate name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    if not ca.exists():
        raise CertificateError(f"no CA in {directory}; a cluster started with --tls makes one")
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    usage = "serverAuth,clientAuth" if server else "clientAuth"
    extensions = [f"extendedKeyUsage={usage}", "basicConstraints=critical,CA:FALSE"]
    if server:
        alt = [f"IP:{h}" if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]+:[0-9a-fA-F:]*", h) else f"DNS:{h}" for h in hosts]
        extensions.append("subjectAltName=" + ",".join(alt))
    # the work folder inside ``directory``: a rename from it is atomic, and possible (``directory`` may be a
    # volume, a filesystem of its own, where a rename from /tmp fails)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".issue-") as work:
        request, config = Path(work) / "req.csr", Path(work) / "ext.cnf"
        config.write_text("\n".join(extensions) + "\n")
        new_key = Path(work) / "key.pem"
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(new_key),
                 "-out", str(request), "-subj", f"/CN={common_name or name}")
        new_cert = Path(work) / "cert.pem"
        _openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                 "-CAserial", str(Path(work) / "ca.srl"), "-out", str(new_cert), "-days", str(VALID_DAYS), "-extfile", str(config))
        _private(new_key)
        # Moved into place key first, each by a rename: a reader never sees half a file.
        os.replace(new_key, key)
        os.replace(new_cert, cert)
    return cert, key


TOKEN_ISSUER = "txlog-local"
TOKEN_KEY_ID = "txlog-local-1"


def create_token_key(directory: Path) -> Path:
    """The RSA key that signs local tokens (kept if there) and ``jwks.json``,
    its public key as servers read it; returns the JWKS path."""
    directory.mkdir(parents=True, exist_ok=True)
    key, jwks = directory / "token-signing-key.pem", directory / "jwks.json"
    if not key.exists():
        with tempfile.TemporaryDirectory(dir=directory, prefix=".key-") as work:  # as in issue()
            new_key = Path(work) / "key.pem"
            _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(new_key))
            _private(new_key)
            os.replace(new_key, key)
    modulus = _openssl("rsa", "-in", str(key), "-noout", "-modulus").decode().strip().split("=", 1)[1]
    document = {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": TOKEN_KEY_ID,
                          "n": b64url_encode(bytes.fromhex(modulus)), "e": b64url_encode((65537).to_bytes(3, "big"))}]}
    jwks.write_text(json.dumps(document, indent=2) + "\n")
    return jwks


def issue_token(directory: Path, name: str, *, lifetime_s: int = VALID_DAYS * 86400, claims: dict | None = None) -> Path:
    """``NAME.token``: a JWT for ``User:NAME`` signed with the local key
    (``claims`` adds or replaces claims, for tests). Returns its path."""
    if not NAME.fullmatch(name):
        raise CertificateError(f"token name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    key = directory / "token-signing-key.pem"
    if not key.exists():
        raise CertificateError(f"no token signing key in {directory}; a cluster started with --tls --tokens makes one")
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT", "kid": TOKEN_KEY_ID}
    body = {"sub": name, "iss": TOKEN_ISSUER, "iat": now, "exp": now + lifetime_s, **(claims or {})}
    signing_input = ".".join(b64url_encode(json.dumps(part, separators=(",", ":")).encode()) for part in (header, body))
    signature = _openssl("dgst", "-sha256", "-sign", str(key), stdin=signing_input.encode())
    token = directory / f"{name}.token"
    fresh = directory / f".{name}.token.new"
    fresh.write_text(f"{signing_input}.{b64url_encode(signature)}\n")
    _private(fresh)
    os.replace(fresh, token)
    return token


def main(argv: list[str] | None = None) -> int:
    """``python -m services.security.certs --dir D --servers a,b --clients c,d``: a CA
    in D (kept if there) and a certificate per name; a server's names its own
    host name (what it is reached by), localhost and 127.0.0.1. What the
    compose file's TLS variant runs once before the services start."""
    parser = argparse.ArgumentParser(prog="python -m services.security.certs", description=main.__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="folder of the CA and the certificates")
    parser.add_argument("--servers", default="", help="comma-separated host names: a server and client certificate each")
    parser.add_argument("--clients", default="", help="comma-separated principal names: a client certificate each")
    args = parser.parse_args(argv)
    directory = Path(args.dir)
    try:
        create_ca(directory)
        for name in filter(None, args.servers.split(",")):
            issue(directory, name, server=True, hosts=(name, "localhost", "127.0.0.1"))
        for name in filter(None, args.clients.split(",")):
            issue(directory, name)
    except CertificateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in sorted(directory.glob("*.pem")):
        if not path.name.endswith("-key.pem"):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
