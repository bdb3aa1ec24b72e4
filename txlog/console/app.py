"""The console's web application: one route per page, each rendering a
template from what ``views.py`` made of the Admin client's answers, and one
for the actions (``actions.py``): a GET shows what an action will do, the
confirmation's POST (with its CSRF token, csrf.py) does it. An error the
cluster answers is shown on the page with its code, never a stack trace.

The Admin client is synchronous and safe to call from any thread (its calls
all run on its own event loop): Starlette runs each page's function in its
thread pool, so pages load side by side and a slow one (a scan waiting on an
offline partition) holds up no other."""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from txlog.console import actions, csrf, views
from txlog.console.rates import Rates
from txlog.net.addresses import WILDCARD_HOSTS
from txlog.protocol.errors import TxlogError

log = logging.getLogger(__name__)
HERE = Path(__file__).parent


def create_app(admin, *, read_only: bool = True, cluster_name: str = "", listen_host: str = "127.0.0.1",
               hanging_after_ms: int = views.HANGING_AFTER_MS, metrics_urls: list[str] | None = None) -> Starlette:
    """The console over ``admin`` (a txlog.Admin); ``read_only``: no action shown or taken; ``metrics_urls``:
    the services' Prometheus endpoints the overview's live rates come from (none: no rates shown)."""
    rates = Rates(metrics_urls or [])
    rates_lock = threading.Lock()
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["duration"] = duration
    templates.env.filters["path_part"] = lambda text: urllib.parse.quote(str(text), safe="")  # '/' and '.' too
    results = actions.Results()
    acting = threading.Lock()  # one action at a time: two confirmations of one abort both check, then both act

    def acted(action, params):
        with acting:
            return action.run(admin, params, settings)

    def asked(view: Callable, *args):
        return view(admin, *args)

    def failure(request: Request, exc: BaseException) -> HTMLResponse:
        """The page for what a view raised: not found (404), a bad ask (400), the cluster's refusal (502), or
        anything else (500, logged with its stack); never a stack trace on the page."""
        if isinstance(exc, views.NotFound):
            status, code = 404, exc.code
        elif isinstance(exc, TxlogError):  # the SDK's errors (ClientError) too
            status, code = 502, getattr(exc, "name", None) or type(exc).__name__
        elif isinstance(exc, (ValueError, TypeError)):
            status, code = 400, "INVALID_REQUEST"
        else:
            log.error("console page failed: %s", request.url.path, exc_info=exc)
            status, code = 500, "INTERNAL_ERROR"
        return templates.TemplateResponse(request, "error.html", {"code": code, "message": str(exc), **common},
                                          status_code=status)

    async def page(request: Request, template: str, view: Callable, *args, **context) -> HTMLResponse:
        try:
            shown = await run_in_threadpool(asked, view, *args)
        except Exception as exc:  # noqa: BLE001 - shown on the page (failure says how)
            return failure(request, exc)
        return templates.TemplateResponse(request, template, {"view": shown, **context, **common})

    common = {"read_only": read_only, "cluster_name": cluster_name, "rates_shown": bool(metrics_urls)}
    settings = {"hanging_after_ms": hanging_after_ms}

    last_sample: list = [float("-inf"), None]  # (when, what) of the last sample

    def sampled():
        with rates_lock:
            last_sample[:] = [time.monotonic(), rates.sample()]
            return last_sample[1]

    def recent_sample():
        """The last sample if the page's poll took one in the last seconds, else a new one: an overview load does
        not queue behind the polls of every open tab."""
        if time.monotonic() - last_sample[0] <= RECENT_SAMPLE_S:
            return last_sample[1]
        return sampled()

    async def rates_now(request):
        """The rates since the last ask and the alerts firing now (the overview polls it)."""
        return JSONResponse(await run_in_threadpool(sampled))

    async def overview(request):
        alerts = await run_in_threadpool(recent_sample) if metrics_urls else None
        return await page(request, "overview.html", views.overview, hanging_after_ms, active="overview", alerts=alerts)

    async def topics(request):
        return await page(request, "topics.html", views.topic_list, active="topics")

    async def topic(request):
        return await page(request, "topic.html", views.topic_detail, request.path_params["name"], active="topics")

    async def transactions(request):
        states = [s for s in request.query_params.getlist("state") if s] or list(views.OPEN_STATES)
        unknown = sorted(set(states) - set(ALL_STATES))
        if unknown:
            return failure(request, ValueError(f"unknown transaction state {unknown[0]!r}; the states are {list(ALL_STATES)}"))
        return await page(request, "transactions.html", views.transaction_list, states, hanging_after_ms,
                          active="transactions", all_states=ALL_STATES)

    async def transaction(request):
        return await page(request, "transaction.html", views.transaction_detail, request.path_params["transactional_id"],
                          active="transactions")

    async def groups(request):
        return await page(request, "groups.html", views.group_list, active="groups")

    async def security(request):
        return await page(request, "security.html", views.security, active="security")

    def refused(request, status: int, code: str, message: str, action: str = "", params: dict | None = None):
        if action:
            shown = {k: v for k, v in (params or {}).items() if k != csrf.FIELD}  # the token stays out of the log
            actions.audit(action, shown, client_of(request), "refused", f"{code}: {message}")
        return templates.TemplateResponse(request, "error.html", {"code": code, "message": message, **common},
                                          status_code=status)

    async def act(request):
        """GET: the confirmation (a dry run for an offset reset); POST: the action, once confirmed."""
        name = request.path_params["name"]
        action = actions.ACTIONS.get(name)
        if action is None:
            return refused(request, 404, "NOT_FOUND", f"no action {name!r}; the actions are {sorted(actions.ACTIONS)}")
        form = dict(request.query_params) if request.method == "GET" else dict(await request.form())
        if read_only:
            return refused(request, 403, "READ_ONLY", "this console was started with --read-only: it takes no action",
                           name if request.method == "POST" else "", form)
        try:
            params = action.parse(form)
        except ValueError as exc:
            return refused(request, 400, "INVALID_REQUEST", str(exc), name if request.method == "POST" else "", form)
        if request.method == "POST":
            if not csrf.valid(request, form.get(csrf.FIELD, "")):
                return refused(request, 403, "CSRF", "the form's token does not match this browser's: "
                               "open the action again from its page", name, params)
            try:
                done = await run_in_threadpool(acted, action, params)
            except Exception as exc:  # noqa: BLE001 - audited, and shown as failure() says
                actions.audit(name, params, client_of(request), "failed", f"{type(exc).__name__}: {exc}")
                if not isinstance(exc, TxlogError):
                    return failure(request, exc)
                return templates.TemplateResponse(request, "action.html", {
                    "action": action, "params": params, "error": str(exc), "code": getattr(exc, "name", ""),
                    **common}, status_code=502)
            actions.audit(name, params, client_of(request), "done")
            return RedirectResponse(f"/actions/{name}/done/{results.add(name, params, done)}", status_code=303)
        try:
            lines, confirmed = await run_in_threadpool(asked, action.preview, params, settings)
        except Exception as exc:  # noqa: BLE001 - shown as failure() says
            return failure(request, exc)
        params = {**params, **confirmed}  # what the confirmation applies exactly (a reset's planned offsets)
        token = csrf.token_of(request)
        response = templates.TemplateResponse(request, "action.html", {
            "action": action, "params": params, "preview": lines, "csrf_field": csrf.FIELD, "csrf": token, **common})
        csrf.remember(response, token)
        return response

    async def action_result(request):
        """What a confirmed action did (where its POST redirected to)."""
        found = results.get(request.path_params["result_id"])
        if found is None or found[0] != request.path_params["name"]:
            return refused(request, 404, "NOT_FOUND", "no such action result (results are kept until the console "
                                                      f"restarts, the last {results.kept} of them)")
        name, params, done = found
        action = actions.ACTIONS[name]
        return templates.TemplateResponse(request, "action.html", {"action": action, "params": params, "done": done,
                                                                   "page": action.page(params), **common})

    allowed_hosts = sorted({listen_host, "localhost", "127.0.0.1", "::1"} - {""})
    return Starlette(middleware=[
        # a page served under another name (DNS rebinding) would be another origin's to read and post from
        Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts if listen_host not in WILDCARD_HOSTS else ["*"]),
        Middleware(SecurityHeaders),
    ], routes=[
        Route("/", overview),
        Route("/topics", topics),
        Route("/topics/{name:path}", topic),
        Route("/transactions", transactions),
        Route("/transactions/{transactional_id:path}", transaction),
        Route("/groups", groups),
        Route("/security", security),
        Route("/rates.json", rates_now),
        Route("/actions/{name}", act, methods=["GET", "POST"]),
        Route("/actions/{name}/done/{result_id}", action_result),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ])


ALL_STATES = ("Empty", "Ongoing", "Prepared", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
              "PrepareEpochFence", "Dead")


RECENT_SAMPLE_S = 3.0


class SecurityHeaders:
    """Pages that no other site may frame, nor learn where they were reached from."""

    HEADERS = [(b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"),
               (b"referrer-policy", b"same-origin"), (b"x-content-type-options", b"nosniff")]

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        return await self.app(scope, receive, with_headers)


def client_of(request: Request) -> str:
    return request.client.host if request.client else ""


def duration(ms) -> str:
    """A duration for people: 850 ms, 12.3 s, 4 min 5 s, 2 h 3 min; "" for None."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
