"""The console's actions: what each takes from its form, what its
confirmation page says, and what it asks of the Admin client. Every action is
shown first (GET: the confirmation, a dry run for an offset reset) and done
only by the confirmation's POST, which carries the CSRF token; each one done
or refused is one audit log line (JSON on the ``txlog.console.audit``
logger). The console acts as its own principal, so on a secured cluster the
cluster's ACLs decide, and a refusal is shown with its code."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from txlog.structs import TopicPartition, TransactionHandle

audit_log = logging.getLogger("txlog.console.audit")
RESET_TARGETS = ("earliest", "latest", "offset")


INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


def _int(form: Mapping[str, str], name: str, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    text = form.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {text!r}") from None
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be from {minimum} to {maximum}, not {value}")
    return value


def _text(form: Mapping[str, str], name: str) -> str:
    text = form.get(name, "").strip()
    if not text:
        raise ValueError(f"{name} is missing")
    return text


@dataclass(frozen=True)
class Action:
    """``preview`` and ``run`` take the Admin, the parsed fields and the console's settings
    (``hanging_after_ms``); ``preview`` answers what the confirmation says and the fields it adds, which the
    confirmation carries and ``run`` applies exactly (a reset's planned offsets)."""

    name: str
    title: str
    parse: Callable[[Mapping[str, str]], dict]  # the form's fields, checked (ValueError saying what is wrong)
    preview: Callable[[object, dict, dict], tuple[list[str], dict]]
    run: Callable[[object, dict, dict], str]  # does it; what was done
    page: Callable[[dict], str]  # the console page showing what it acted on (linked from its result)


def parse_abort(form) -> dict:
    return {"topic": _text(form, "topic"), "partition": _int(form, "partition"),
            "producer_id": _int(form, "producer_id", maximum=INT64_MAX), "producer_epoch": _int(form, "producer_epoch"),
            "coordinator_epoch": _int(form, "coordinator_epoch", minimum=-1)}


def still_hanging(admin, p: dict, settings: dict) -> None:
    """ValueError unless the transaction is hanging now: an ABORT marker for a live transaction would end it
    on this partition alone while it commits elsewhere."""
    hanging = admin.find_hanging([p["topic"]], max_transaction_timeout_ms=settings["hanging_after_ms"])
    if not any((h.partition, h.producer_id, h.producer_epoch) == (p["partition"], p["producer_id"], p["producer_epoch"])
               for h in hanging):
        raise ValueError(f"producer {p['producer_id']} (epoch {p['producer_epoch']}) has no hanging transaction on "
                         f"{p['topic']}-{p['partition']} now: nothing to abort")


def preview_abort(admin, p: dict, settings: dict) -> tuple[list[str], dict]:
    still_hanging(admin, p, settings)
    return [f"Write an ABORT marker on {p['topic']}-{p['partition']} for producer {p['producer_id']} "
            f"(epoch {p['producer_epoch']}): its open transaction there is rolled back and the partition's last "
            "stable offset moves past it."], {}


def run_abort(admin, p: dict, settings: dict) -> str:
    still_hanging(admin, p, settings)
    admin.abort_transaction(TopicPartition(p["topic"], p["partition"]), p["producer_id"], p["producer_epoch"],
                            p["coordinator_epoch"])
    return f"aborted producer {p['producer_id']}'s transaction on {p['topic']}-{p['partition']}"


def parse_complete(form) -> dict:
    outcome = form.get("outcome", "")
    if outcome not in ("commit", "abort"):
        raise ValueError(f"outcome must be commit or abort, not {outcome!r}")
    return {"transactional_id": _text(form, "transactional_id"), "producer_id": _int(form, "producer_id", maximum=INT64_MAX),
            "producer_epoch": _int(form, "producer_epoch"), "outcome": outcome}


def preview_complete(admin, p: dict, settings: dict) -> tuple[list[str], dict]:
    return [f"{p['outcome'].capitalize()} the prepared transaction of {p['transactional_id']} "
            f"(handle: producer {p['producer_id']}, epoch {p['producer_epoch']}); this cannot be undone."], {}


def run_complete(admin, p: dict, settings: dict) -> str:
    admin.complete_transaction(TransactionHandle(p["transactional_id"], p["producer_id"], p["producer_epoch"]),
                               p["outcome"] == "commit")
    return f"{p['outcome']} of {p['transactional_id']}'s prepared transaction decided"


def parse_reset(form) -> dict:
    to = form.get("to", "")
    if to not in RESET_TARGETS:
        raise ValueError(f"to must be one of {', '.join(RESET_TARGETS)}, not {to!r}")
    parsed = {"group_id": _text(form, "group_id"), "topic": _text(form, "topic"), "to": to}
    if to == "offset":
        parsed["offset"] = _int(form, "offset", maximum=INT64_MAX)
    if form.get("plan"):  # the confirmation's: the offsets the dry run showed, applied exactly
        parsed["plan"] = form["plan"]
    return parsed


def planned_offsets(admin, p: dict) -> dict[TopicPartition, tuple[int | None, int]]:
    """Each partition of the topic: (its committed offset now, the one the reset sets), as `txlog groups
    reset-offsets` plans it: latest is the last stable offset, and every target is kept within [log start,
    last stable offset]. ValueError for a group that does not exist (a typo would make one)."""
    if p["group_id"] not in {g.group_id for g in admin.list_groups()}:
        raise ValueError(f"there is no group {p['group_id']!r}")
    (topic,) = admin.describe_topics([p["topic"]])
    tps = [TopicPartition(topic.name, part.partition) for part in topic.partitions]
    committed = admin.list_group_offsets(p["group_id"])
    starts = admin.list_offsets({tp: "earliest" for tp in tps})
    ends = admin.list_offsets({tp: "last_stable" for tp in tps})
    planned = {}
    for tp in tps:
        target = {"earliest": starts[tp].offset, "latest": ends[tp].offset}.get(p["to"], p.get("offset"))
        now = committed.get(tp)
        planned[tp] = (getattr(now, "offset", now), min(max(target, starts[tp].offset), ends[tp].offset))
    return planned


def plan_text(planned: dict[TopicPartition, tuple[int | None, int]]) -> str:
    return ",".join(f"{tp.partition}={new}" for tp, (_, new) in sorted(planned.items()))


def plan_of(p: dict) -> dict[TopicPartition, int]:
    try:
        return {TopicPartition(p["topic"], int(part)): int(offset)
                for part, offset in (item.split("=") for item in p["plan"].split(","))}
    except ValueError:
        raise ValueError(f"plan must be PARTITION=OFFSET,..., not {p['plan']!r}") from None


def preview_reset(admin, p: dict, settings: dict) -> tuple[list[str], dict]:
    planned = planned_offsets(admin, p)
    lines = [f"Dry run: group {p['group_id']}'s committed offsets of {p['topic']} would become:"]
    for tp, (now, new) in sorted(planned.items()):
        lines.append(f"{tp.topic}-{tp.partition}: {'none' if now is None else now} -> {new}")
    lines.append("The group must have no live member (the cluster refuses the change otherwise).")
    return lines, {"plan": plan_text(planned)}


def run_reset(admin, p: dict, settings: dict) -> str:
    if "plan" not in p:
        raise ValueError("a reset applies the offsets of its dry run: confirm it from the dry run's page")
    plan = plan_of(p)
    admin.alter_group_offsets(p["group_id"], plan)
    return f"group {p['group_id']}'s offsets of {p['topic']} set as planned ({len(plan)} partitions)"


ACTIONS: dict[str, Action] = {action.name: action for action in (
    Action("abort-hanging", "Abort a hanging transaction", parse_abort, preview_abort, run_abort,
           lambda p: "/topics/" + quote(p["topic"], safe="")),
    Action("complete-prepared", "Complete a prepared transaction", parse_complete, preview_complete, run_complete,
           lambda p: "/transactions/" + quote(p["transactional_id"], safe="")),
    Action("reset-offsets", "Reset a group's offsets", parse_reset, preview_reset, run_reset, lambda p: "/groups"),
)}


class Results:
    """What the last actions did, kept for their result pages: a confirmed POST
    that succeeds answers with a redirect to its result (Post/Redirect/Get), so
    reloading the page or going back shows the result again and never acts twice.
    Each result is named by a random id (a result page is not guessable) and
    the oldest are forgotten past ``kept``."""

    def __init__(self, kept: int = 100):
        self.kept = kept
        self._results: OrderedDict[str, tuple[str, dict, str]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, action: str, params: dict, done: str) -> str:
        result_id = secrets.token_urlsafe(16)
        with self._lock:
            self._results[result_id] = (action, params, done)
            while len(self._results) > self.kept:
                self._results.popitem(last=False)
        return result_id

    def get(self, result_id: str) -> tuple[str, dict, str] | None:
        with self._lock:
            return self._results.get(result_id)


def audit(action: str, params: dict, client: str, outcome: str, error: str = "") -> None:
    """One line per action done or refused: who asked (the browser's address), what, and what came of it."""
    audit_log.info(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "action": action, "params": params,
                               "client": client, "outcome": outcome, "error": error}, sort_keys=True))
