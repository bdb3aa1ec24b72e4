"""Bearer tokens: signed JWTs (RFC 7519) that name a principal, for clients
that cannot hold a certificate (issue 15; Kafka's SASL/OAUTHBEARER).

A client sends ``authorization: Bearer <JWT>`` with every call (only over
TLS). A server verifies it against the public keys of a JWKS file (RFC 7517,
the document an OAuth provider publishes at its jwks_uri; re-read when it
changes): the signature (RS256: RSASSA-PKCS1-v1_5 with SHA-256, which every
provider offers), the key id, ``exp`` (required), ``nbf`` and ``iat`` with
a little clock skew, and ``iss`` and ``aud`` when the server is set to
expect them. The principal is ``User:`` + the ``sub`` claim (or another
claim the server names). Any failure is a :class:`TokenError` saying which
check failed; the server answers it AUTHENTICATION_FAILED (UNAUTHENTICATED).

RSA verification is one modular exponentiation (pure Python: the project
takes no cryptography dependency), so verified tokens are remembered until
they expire.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass

CLOCK_SKEW_S = 60
# DER of the DigestInfo that precedes a SHA-256 digest in a PKCS#1 v1.5 signature (RFC 8017, 9.2)
SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")
CACHE_MAX = 10_000


class TokenError(ValueError):
    """A token that is not accepted, saying which check failed."""


def b64url_decode(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise TokenError("a part of the token is not base64url") from None


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class RsaKey:
    n: int
    e: int

    def verifies(self, message: bytes, signature: bytes) -> bool:
        size = (self.n.bit_length() + 7) // 8
        if len(signature) != size:
            return False
        value = int.from_bytes(signature, "big")
        if value >= self.n:
            return False
        encoded = pow(value, self.e, self.n).to_bytes(size, "big")
        suffix = SHA256_DIGEST_INFO + hashlib.sha256(message).digest()
        expected = b"\x00\x01" + b"\xff" * (size - len(suffix) - 3) + b"\x00" + suffix
        return hmac.compare_digest(encoded, expected)


def parse_jwks(data: bytes) -> dict[str, RsaKey]:
    """{key id: key} of a JWKS document's RSA signing keys."""
    try:
        document = json.loads(data)
        keys = document["keys"]
    except (ValueError, KeyError, TypeError):
        raise TokenError("the JWKS file is not a JSON object with a 'keys' list") from None
    found = {}
    for key in keys:
        if not isinstance(key, dict) or key.get("kty") != "RSA" or key.get("use", "sig") != "sig":
            continue
        try:
            found[str(key.get("kid", ""))] = RsaKey(int.from_bytes(b64url_decode(key["n"]), "big"),
                                                    int.from_bytes(b64url_decode(key["e"]), "big"))
        except KeyError:
            raise TokenError(f"JWKS key {key.get('kid')!r} lacks n or e") from None
    if not found:
        raise TokenError("the JWKS file holds no RSA signing key")
    return found


@dataclass(frozen=True)
class Expectations:
    issuer: str = ""
    audience: str = ""
    principal_claim: str = "sub"


def verify(token: str, keys: dict[str, RsaKey], expect: Expectations, now: float) -> dict:
    """The token's claims once every check passed; TokenError naming the first that failed."""
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError("a JWT has three dot-separated parts")
    try:
        header, claims = json.loads(b64url_decode(parts[0])), json.loads(b64url_decode(parts[1]))
    except ValueError:
        raise TokenError("the token's header or claims are not JSON") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise TokenError("the token's header and claims must be JSON objects")
    if header.get("alg") != "RS256":
        raise TokenError(f"the token is signed with {header.get('alg')!r}; only RS256 is accepted")
    kid = str(header.get("kid", ""))
    key = keys.get(kid)
    if key is None:
        raise TokenError(f"no key {kid!r} in the JWKS file")
    if not key.verifies(f"{parts[0]}.{parts[1]}".encode(), b64url_decode(parts[2])):
        raise TokenError("the token's signature does not verify")
    exp = claims.get("exp")
    if not isinstance(exp, (int, float)):
        raise TokenError("the token has no exp (expiry) claim")
    if now > exp + CLOCK_SKEW_S:
        raise TokenError("the token has expired")
    for claim in ("nbf", "iat"):
        if isinstance(claims.get(claim), (int, float)) and claims[claim] > now + CLOCK_SKEW_S:
            raise TokenError(f"the token's {claim} is in the future")
    if expect.issuer and claims.get("iss") != expect.issuer:
        raise TokenError(f"the token's issuer is {claims.get('iss')!r}, not {expect.issuer!r}")
    if expect.audience:
        audience = claims.get("aud")
        if expect.audience not in (audience if isinstance(audience, list) else [audience]):
            raise TokenError(f"the token is not meant for audience {expect.audience!r}")
    subject = claims.get(expect.principal_claim)
    if not isinstance(subject, str) or not subject:
        raise TokenError(f"the token has no {expect.principal_claim!r} claim to name its principal")
    return claims


class TokenVerifier:
    """Verifies bearer tokens against a JWKS file, re-read when it changes."""

    def __init__(self, jwks_file: str, expect: Expectations):
        self.jwks_file = jwks_file
        self.expect = expect
        self._stamp = None
        self._keys: dict[str, RsaKey] = {}
        self._verified: dict[str, tuple[str, float]] = {}  # token -> (principal, expiry)
        self._load()

    def _load(self) -> None:
        try:
            stat = os.stat(self.jwks_file)
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if stamp == self._stamp:
                return
            with open(self.jwks_file, "rb") as file:
                keys = parse_jwks(file.read())
        except OSError as exc:
            if self._stamp is None:
                raise TokenError(f"jwks_file {self.jwks_file!r} cannot be read: {exc.strerror}") from None
            return  # replaced mid-rotation: keep the last good keys
        self._keys, self._stamp = keys, stamp
        self._verified.clear()  # a key may have been withdrawn

    def principal(self, token: str, now: float | None = None) -> str:
        now = time.time() if now is None else now
        self._load()
        known = self._verified.get(token)
        if known is not None and now <= known[1] + CLOCK_SKEW_S:
            return known[0]
        claims = verify(token, self._keys, self.expect, now)
        principal = "User:" + claims[self.expect.principal_claim]
        if len(self._verified) >= CACHE_MAX:
            self._verified.clear()
        self._verified[token] = (principal, claims["exp"])
        return principal
