"""Bearer-token verification (services/security/tokens.py) against tokens openssl
signed (services/security/certs.py): each check refuses what it should and names
itself."""

from __future__ import annotations

import json
import time

import pytest

from services.security import certs, tokens
from services.security.tokens import Expectations, TokenError, TokenVerifier


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("token-keys")
    return directory, certs.create_token_key(directory)


def issued(directory, name="carol", **claims) -> str:
    return certs.issue_token(directory, name, claims=claims).read_text().strip()


def test_a_signed_token_names_its_principal_and_is_remembered(keys):
    directory, jwks = keys
    verifier = TokenVerifier(str(jwks), Expectations(issuer=certs.TOKEN_ISSUER))
    token = issued(directory)
    assert verifier.principal(token) == "User:carol"
    assert token in verifier._verified  # the next call skips the exponentiation
    with pytest.raises(TokenError, match="expired"):
        verifier.principal(token, now=time.time() + 10 * 365 * 86400)


@pytest.mark.parametrize("claims, expect, complaint", [
    ({"exp": int(time.time()) - 3600}, Expectations(), "expired"),
    ({"nbf": int(time.time()) + 3600}, Expectations(), "nbf is in the future"),
    ({"iss": "someone-else"}, Expectations(issuer=certs.TOKEN_ISSUER), "issuer"),
    ({"aud": ["a", "b"]}, Expectations(audience="txlog"), "audience"),
    ({"sub": ""}, Expectations(), "'sub' claim"),
])
def test_each_claim_check_refuses_and_says_which(keys, claims, expect, complaint):
    directory, jwks = keys
    with pytest.raises(TokenError, match=complaint):
        TokenVerifier(str(jwks), expect).principal(issued(directory, **claims))


def test_the_audience_and_another_principal_claim_are_honoured(keys):
    directory, jwks = keys
    verifier = TokenVerifier(str(jwks), Expectations(audience="txlog", principal_claim="client_id"))
    assert verifier.principal(issued(directory, aud=["other", "txlog"], client_id="svc-7")) == "User:svc-7"


def test_tampered_unsigned_and_unknown_key_tokens_are_refused(keys, tmp_path):
    directory, jwks = keys
    verifier = TokenVerifier(str(jwks), Expectations())
    header, body, signature = issued(directory).split(".")
    claims = json.loads(tokens.b64url_decode(body))
    claims["sub"] = "admin"
    with pytest.raises(TokenError, match="signature"):
        verifier.principal(".".join([header, tokens.b64url_encode(json.dumps(claims).encode()), signature]))
    unsigned = tokens.b64url_encode(json.dumps({"alg": "none"}).encode())
    with pytest.raises(TokenError, match="only RS256"):
        verifier.principal(f"{unsigned}.{body}.")
    unknown = tokens.b64url_encode(json.dumps({"alg": "RS256", "kid": "nope"}).encode())
    with pytest.raises(TokenError, match="no key 'nope'"):
        verifier.principal(f"{unknown}.{body}.{signature}")
    with pytest.raises(TokenError, match="three"):
        verifier.principal("not-a-jwt")


def test_a_replaced_jwks_file_withdraws_the_old_keys(keys, tmp_path):
    directory, jwks = keys
    copy = tmp_path / "jwks.json"
    copy.write_bytes(jwks.read_bytes())
    verifier = TokenVerifier(str(copy), Expectations())
    token = issued(directory)
    assert verifier.principal(token) == "User:carol"
    other = certs.create_token_key(tmp_path / "other")
    copy.write_text(other.read_text() + " ")  # another key only (the size differs, so the change is seen)
    with pytest.raises(TokenError, match="signature"):
        verifier.principal(token)


def test_a_jwks_without_rsa_signing_keys_is_refused(tmp_path):
    empty = tmp_path / "jwks.json"
    empty.write_text(json.dumps({"keys": [{"kty": "EC", "kid": "x"}]}))
    with pytest.raises(TokenError, match="no RSA signing key"):
        TokenVerifier(str(empty), Expectations())
    with pytest.raises(TokenError, match="cannot be read"):
        TokenVerifier(str(tmp_path / "missing.json"), Expectations())
