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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from txlog.structs import TopicPartition, TransactionHandle

audit_log = logging.getLogger("txlog.console.audit")
RESET_TARGETS = ("earliest", "latest", "offset")


def _int(form: Mapping[str, str], name: str, minimum: int | None = 0) -> int:
    text = form.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {text!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {value}")
    return value


def _text(form: Mapping[str, str], name: str) -> str:
    text = form.get(name, "").strip()
    if not text:
        raise ValueError(f"{name} is missing")
    return text


@dataclass(frozen=True)
class Action:
    name: str
    title: str
    parse: Callable[[Mapping[str, str]], dict]  # the form's fields, checked (ValueError saying what is wrong)
    preview: Callable[[object, dict], list[str]]  # what the confirmation page says it will do (may ask the Admin)
    run: Callable[[object, dict], str]  # does it; what was done


def parse_abort(form) -> dict:
    return {"topic": _text(form, "topic"), "partition": _int(form, "partition"),
            "producer_id": _int(form, "producer_id"), "producer_epoch": _int(form, "producer_epoch"),
            "coordinator_epoch": _int(form, "coordinator_epoch", minimum=-1)}


def preview_abort(admin, p: dict) -> list[str]:
    return [f"Write an ABORT marker on {p['topic']}-{p['partition']} for producer {p['producer_id']} "
            f"(epoch {p['producer_epoch']}): its open transaction there is rolled back and the partition's last "
            "stable offset moves past it."]


def run_abort(admin, p: dict) -> str:
    admin.abort_transaction(TopicPartition(p["topic"], p["partition"]), p["producer_id"], p["producer_epoch"],
                            p["coordinator_epoch"])
    return f"aborted producer {p['producer_id']}'s transaction on {p['topic']}-{p['partition']}"


def parse_complete(form) -> dict:
    outcome = form.get("outcome", "")
    if outcome not in ("commit", "abort"):
        raise ValueError(f"outcome must be commit or abort, not {outcome!r}")
    return {"transactional_id": _text(form, "transactional_id"), "producer_id": _int(form, "producer_id"),
            "producer_epoch": _int(form, "producer_epoch"), "outcome": outcome}


def preview_complete(admin, p: dict) -> list[str]:
    return [f"{p['outcome'].capitalize()} the prepared transaction of {p['transactional_id']} "
            f"(handle: producer {p['producer_id']}, epoch {p['producer_epoch']}); this cannot be undone."]


def run_complete(admin, p: dict) -> str:
    admin.complete_transaction(TransactionHandle(p["transactional_id"], p["producer_id"], p["producer_epoch"]),
                               p["outcome"] == "commit")
    return f"{p['outcome']} of {p['transactional_id']}'s prepared transaction decided"


def parse_reset(form) -> dict:
    to = form.get("to", "")
    if to not in RESET_TARGETS:
        raise ValueError(f"to must be one of {', '.join(RESET_TARGETS)}, not {to!r}")
    parsed = {"group_id": _text(form, "group_id"), "topic": _text(form, "topic"), "to": to}
    if to == "offset":
        parsed["offset"] = _int(form, "offset")
    return parsed


def reset_offsets(admin, p: dict) -> dict[TopicPartition, tuple[int | None, int]]:
    """Each partition of the topic: (its committed offset now, the one the reset sets)."""
    (topic,) = admin.describe_topics([p["topic"]])
    tps = [TopicPartition(topic.name, part.partition) for part in topic.partitions]
    committed = admin.list_group_offsets(p["group_id"])
    if p["to"] == "offset":
        targets = {tp: p["offset"] for tp in tps}
    else:
        targets = {tp: found.offset for tp, found in admin.list_offsets({tp: p["to"] for tp in tps}).items()}
    now = {tp: getattr(committed.get(tp), "offset", committed.get(tp)) for tp in tps}
    return {tp: (now[tp], targets[tp]) for tp in tps}


def preview_reset(admin, p: dict) -> list[str]:
    lines = [f"Dry run: group {p['group_id']}'s committed offsets of {p['topic']} would become:"]
    for tp, (now, new) in sorted(reset_offsets(admin, p).items()):
        lines.append(f"{tp.topic}-{tp.partition}: {'none' if now is None else now} -> {new}")
    lines.append("The group must have no live member (the cluster refuses the change otherwise).")
    return lines


def run_reset(admin, p: dict) -> str:
    planned = reset_offsets(admin, p)
    admin.alter_group_offsets(p["group_id"], {tp: new for tp, (_, new) in planned.items()})
    return f"group {p['group_id']}'s offsets of {p['topic']} reset to {p['to']} ({len(planned)} partitions)"


ACTIONS: dict[str, Action] = {action.name: action for action in (
    Action("abort-hanging", "Abort a hanging transaction", parse_abort, preview_abort, run_abort),
    Action("complete-prepared", "Complete a prepared transaction", parse_complete, preview_complete, run_complete),
    Action("reset-offsets", "Reset a group's offsets", parse_reset, preview_reset, run_reset),
)}


def audit(action: str, params: dict, client: str, outcome: str, error: str = "") -> None:
    """One line per action done or refused: who asked (the browser's address), what, and what came of it."""
    audit_log.info(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "action": action, "params": params,
                               "client": client, "outcome": outcome, "error": error}, sort_keys=True))
