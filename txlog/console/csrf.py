"""Cross-site request forgery protection for the console's actions.

The confirmation page sets a token in a cookie (SameSite=Strict, HttpOnly)
and in its form; the POST is taken only when both are there, equal, and the
token is one this console signed (an HMAC under a secret made at start-up),
so a cookie planted by another site on the same host (cookies ignore ports)
does not do. The POST must also come from the console's own pages: a browser's
Origin (or, without one, Sec-Fetch-Site) must say so. With the Host check
(app.py), a page of another origin, DNS rebinding included, cannot read a
token nor send one."""

from __future__ import annotations

import hashlib
import hmac
import secrets

COOKIE = "txlog_console_csrf"
FIELD = "csrf"
_SECRET = secrets.token_bytes(32)


def _signed(nonce: str) -> str:
    return nonce + "." + hmac.new(_SECRET, nonce.encode(), hashlib.sha256).hexdigest()


def _ours(token: str) -> bool:
    nonce, _, _ = token.partition(".")
    return bool(nonce) and hmac.compare_digest(_signed(nonce).encode(), token.encode())


def token_of(request) -> str:
    """The browser's token when this console signed it, else a new one."""
    token = request.cookies.get(COOKIE, "")
    return token if _ours(token) else _signed(secrets.token_urlsafe(24))


def remember(response, token: str) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict")


def same_origin(request) -> bool:
    """Whether a POST comes from the console's own pages, as far as the browser tells."""
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == f"{request.url.scheme}://{request.headers.get('host', '')}"
    return request.headers.get("sec-fetch-site", "same-origin") == "same-origin"


def valid(request, submitted: str) -> bool:
    cookie = request.cookies.get(COOKIE, "")
    return _ours(cookie) and hmac.compare_digest(cookie.encode(), submitted.encode()) and same_origin(request)
