"""The console's web application: one route per page, each rendering a
template from what ``views.py`` made of the Admin client's answers. The pages
are read-only; an error the cluster answers is shown on the page with its code,
never a stack trace.

The Admin client is synchronous: Starlette runs each page's function in its
thread pool, and one lock keeps the client to one call at a time (an operator's
console, not a load)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from txlog.console import views
from txlog.protocol.errors import TxlogError

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
NOT_FOUND_CODES = ("UNKNOWN_TOPIC_OR_PARTITION", "TRANSACTIONAL_ID_NOT_FOUND", "GROUP_ID_NOT_FOUND")


def create_app(admin, *, read_only: bool = True, cluster_name: str = "") -> Starlette:
    """The console over ``admin`` (a txlog.Admin)."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["duration"] = duration
    lock = threading.Lock()

    def asked(view: Callable, *args):
        with lock:
            return view(admin, *args)

    async def page(request: Request, template: str, view: Callable, *args, **context) -> HTMLResponse:
        try:
            shown = await run_in_threadpool(asked, view, *args)
        except TxlogError as exc:  # the SDK's errors (ClientError) too
            code = getattr(exc, "name", None) or type(exc).__name__
            log.warning("console page failed", extra={"fields": {"path": request.url.path, "error": str(exc)}})
            return templates.TemplateResponse(request, "error.html", {"code": code, "message": str(exc), **common},
                                              status_code=404 if code in NOT_FOUND_CODES else 502)
        return templates.TemplateResponse(request, template, {"view": shown, **context, **common})

    common = {"read_only": read_only, "cluster_name": cluster_name}

    async def overview(request):
        return await page(request, "overview.html", views.overview, active="overview")

    async def topics(request):
        return await page(request, "topics.html", views.topic_list, active="topics")

    async def topic(request):
        return await page(request, "topic.html", views.topic_detail, request.path_params["name"], active="topics")

    async def transactions(request):
        states = [s for s in request.query_params.getlist("state") if s]
        return await page(request, "transactions.html", views.transaction_list, states, active="transactions",
                          all_states=ALL_STATES)

    async def transaction(request):
        return await page(request, "transaction.html", views.transaction_detail, request.path_params["transactional_id"],
                          active="transactions")

    async def groups(request):
        return await page(request, "groups.html", views.group_list, active="groups")

    return Starlette(routes=[
        Route("/", overview),
        Route("/topics", topics),
        Route("/topics/{name:path}", topic),
        Route("/transactions", transactions),
        Route("/transactions/{transactional_id:path}", transaction),
        Route("/groups", groups),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ])


ALL_STATES = ("Empty", "Ongoing", "Prepared", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
              "PrepareEpochFence", "Dead")


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
