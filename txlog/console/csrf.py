"""Cross-site request forgery protection for the console's actions, as a
double-submit cookie: the confirmation page sets a random token in a cookie
(SameSite=Strict, HttpOnly) and in its form; the POST is taken only when both
are there and equal. Another site can make a browser send the cookie with a
cross-site POST only against SameSite's rule, and can never read it to put it
in the form."""

from __future__ import annotations

import hmac
import secrets

COOKIE = "txlog_console_csrf"
FIELD = "csrf"


def token_of(request) -> str:
    """The browser's token (a new one if it has none yet)."""
    return request.cookies.get(COOKIE) or secrets.token_urlsafe(32)


def remember(response, token: str) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict")


def valid(request, submitted: str) -> bool:
    cookie = request.cookies.get(COOKIE, "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), submitted.encode())
