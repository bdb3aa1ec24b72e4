"""The rules for names clients choose: topics, consumer groups, transactional
ids. One place, used by every service and the client SDK. Every check is a
whole-string match (``fullmatch``): ``$`` would let a trailing newline in."""

from __future__ import annotations

import re
from typing import NamedTuple

from txlog.protocol.errors import ErrorCode, TxlogError

NAME_CHARS = re.compile(r"[a-zA-Z0-9._-]+")
# ":" too: jobs build ids as <job>:<topic>:<partition>. "/" separates an id's
# transaction group from the rest: <group>/<member>.
TRANSACTION_GROUP_CHARS = re.compile(r"[a-zA-Z0-9._:-]+")
TRANSACTIONAL_ID_CHARS = re.compile(r"[a-zA-Z0-9._:-]+(?:/[a-zA-Z0-9._:/-]+)?")
TRANSACTION_GROUP_SEPARATOR = "/"
TOPIC_NAME_CHARS_MAX = 249
GROUP_ID_CHARS_MAX = 255
TRANSACTIONAL_ID_CHARS_MAX = 255
MESSAGE_NAME_CHARS_MAX = 300  # a name quoted in an error message is cut here (status messages travel in headers)


def is_topic_name(name: str) -> bool:
    return isinstance(name, str) and 0 < len(name) <= TOPIC_NAME_CHARS_MAX \
        and NAME_CHARS.fullmatch(name) is not None and name not in (".", "..")


def is_group_id(group_id: str) -> bool:
    return isinstance(group_id, str) and 0 < len(group_id) <= GROUP_ID_CHARS_MAX and NAME_CHARS.fullmatch(group_id) is not None


def is_transactional_id(transactional_id: str) -> bool:
    return isinstance(transactional_id, str) and 0 < len(transactional_id) <= TRANSACTIONAL_ID_CHARS_MAX \
        and TRANSACTIONAL_ID_CHARS.fullmatch(transactional_id) is not None


def transaction_group(transactional_id: str) -> str:
    """The transaction group of an id: the part before its first "/", or the whole
    id. Every id of a group lives on one transaction-log partition (the group's),
    so one coordinator can commit them together."""
    return transactional_id.split(TRANSACTION_GROUP_SEPARATOR, 1)[0]


def is_transaction_group(group_id: str) -> bool:
    return isinstance(group_id, str) and 0 < len(group_id) <= TRANSACTIONAL_ID_CHARS_MAX \
        and TRANSACTION_GROUP_CHARS.fullmatch(group_id) is not None


def quoted(name: str) -> str:
    return repr(name[:MESSAGE_NAME_CHARS_MAX])


def check_topic_name(name: str) -> str:
    if not is_topic_name(name):
        raise TxlogError(ErrorCode.Value("INVALID_TOPIC"), f"topic name {quoted(name)} is invalid: 1 to "
                         f"{TOPIC_NAME_CHARS_MAX} characters of [a-zA-Z0-9._-], not '.' or '..'")
    return name


def check_group_id(group_id: str) -> str:
    if not is_group_id(group_id):
        raise TxlogError(ErrorCode.Value("INVALID_GROUP_ID"), f"group id {quoted(group_id)} is invalid: 1 to "
                         f"{GROUP_ID_CHARS_MAX} characters of [a-zA-Z0-9._-]")
    return group_id


def check_transactional_id(transactional_id: str) -> str:
    if not is_transactional_id(transactional_id):
        raise TxlogError(ErrorCode.Value("INVALID_TRANSACTIONAL_ID"), f"transactional id {quoted(transactional_id)} "
                         f"is invalid: 1 to {TRANSACTIONAL_ID_CHARS_MAX} characters of [a-zA-Z0-9._:-], "
                         "optionally followed by '/' and more of [a-zA-Z0-9._:/-] (<group>/<member>)")
    return transactional_id


def check_transaction_group(group_id: str) -> str:
    if not is_transaction_group(group_id):
        raise TxlogError(ErrorCode.Value("INVALID_REQUEST"), f"transaction group {quoted(group_id)} is invalid: 1 to "
                         f"{TRANSACTIONAL_ID_CHARS_MAX} characters of [a-zA-Z0-9._:-] (the part of a transactional "
                         "id before its first '/')")
    return group_id


class TopicPartition(NamedTuple):
    """One partition of one topic; a plain ``(topic, partition)`` tuple works too."""

    topic: str
    partition: int

    def __str__(self) -> str:  # in messages, as Kafka writes it: orders-3
        return f"{self.topic}-{self.partition}"


def as_tp(value) -> TopicPartition:
    """A TopicPartition from a TopicPartition or a ``(topic, partition)`` pair."""
    if isinstance(value, TopicPartition):
        return value
    topic, partition = value
    if not isinstance(topic, str) or not isinstance(partition, int) or isinstance(partition, bool):
        raise TypeError(f"a topic partition is (topic: str, partition: int), not {value!r}")
    return TopicPartition(topic, partition)
