"""Access control lists, Kafka's model: what one binding grants or refuses,
and the decision for one (principal, host, resource, operation); pure, no I/O
(issue 15; services/security/authorizer.py stores them in ZooKeeper and checks calls).

A binding names a resource pattern (a type, a name, and whether the name is
LITERAL or a PREFIXED one), a principal (``User:NAME``, or ``User:*`` for
every principal), a host (an IP address, or ``*``), an operation and a
permission (Allow or Deny). A LITERAL name ``*`` matches every resource of
its type.

The decision, as Kafka's authorizer makes it:

- a Deny that matches refuses, whatever allows (Deny wins);
- otherwise an Allow that matches grants;
- otherwise the call is refused (deny by default).

A binding matches an operation it names, or any operation when it names All.
An Allow of Read, Write, Delete or Alter also allows Describe, and an Allow
of AlterConfigs allows DescribeConfigs (Kafka's implied operations); a Deny
refuses only what it names (or everything, with All).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from txlog.v1 import partition_pb2

TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER = "Topic", "Group", "TransactionalId", "Cluster"
RESOURCE_TYPES = (TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER)
CLUSTER_NAME = "txlog-cluster"  # the one Cluster resource (Kafka's "kafka-cluster")

LITERAL, PREFIXED = "LITERAL", "PREFIXED"
PATTERN_TYPES = (LITERAL, PREFIXED)

ALL = "All"
OPERATIONS = (ALL, "Read", "Write", "Create", "Delete", "Alter", "Describe", "DescribeConfigs", "AlterConfigs",
              "IdempotentWrite", "ClusterAction")
ALLOW, DENY = "Allow", "Deny"
PERMISSIONS = (ALLOW, DENY)

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

# operation asked -> the allowed operations that grant it too
IMPLIED_BY = {"Describe": ("Read", "Write", "Delete", "Alter"), "DescribeConfigs": ("AlterConfigs",)}


class AclError(ValueError):
    """A binding or filter that cannot be: the message says which part."""


@dataclass(frozen=True)
class AclBinding:
    resource_type: str
    pattern_type: str
    resource_name: str
    principal: str
    host: str
    operation: str
    permission: str

    def check(self) -> AclBinding:
        """The binding itself, or AclError naming what is wrong with it."""
        if self.resource_type not in RESOURCE_TYPES:
            raise AclError(f"resource type must be one of {', '.join(RESOURCE_TYPES)}, got {self.resource_type!r}")
        if self.pattern_type not in PATTERN_TYPES:
            raise AclError(f"pattern type must be LITERAL or PREFIXED, got {self.pattern_type!r}")
        if not self.resource_name:
            raise AclError("the resource name is empty")
        if self.resource_type == CLUSTER and (self.pattern_type, self.resource_name) != (LITERAL, CLUSTER_NAME):
            raise AclError(f"the Cluster resource is the LITERAL {CLUSTER_NAME!r}")
        if self.pattern_type == PREFIXED and self.resource_name == WILDCARD:
            raise AclError("a PREFIXED pattern cannot be '*' (the LITERAL '*' matches every name)")
        check_principal(self.principal)
        if not self.host:
            raise AclError("the host is empty ('*' is every host)")
        if self.operation not in OPERATIONS:
            raise AclError(f"operation must be one of {', '.join(OPERATIONS)}, got {self.operation!r}")
        if self.permission not in PERMISSIONS:
            raise AclError(f"permission must be Allow or Deny, got {self.permission!r}")
        return self

    def matches_resource(self, resource_type: str, name: str) -> bool:
        if resource_type != self.resource_type:
            return False
        if self.pattern_type == PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)

    def applies_to(self, principal: str, host: str) -> bool:
        return self.principal in (principal, WILDCARD_PRINCIPAL) and self.host in (host, WILDCARD)

    def encode_entry(self) -> dict:
        """What the resource's znode stores of it (the pattern is the znode)."""
        return {"principal": self.principal, "host": self.host, "operation": self.operation, "permission": self.permission}


def check_principal(principal: str) -> str:
    kind, _, name = principal.partition(":")
    if kind != "User" or not name:
        raise AclError(f"a principal is User:NAME (or User:* for everyone), got {principal!r}")
    return principal


def authorized(bindings: Iterable[AclBinding], principal: str, host: str, resource_type: str, name: str,
               operation: str) -> bool:
    """Whether the bindings let ``principal`` at ``host`` do ``operation`` on the resource."""
    granting = {operation, ALL, *IMPLIED_BY.get(operation, ())}
    allowed = False
    for binding in bindings:
        if not (binding.matches_resource(resource_type, name) and binding.applies_to(principal, host)):
            continue
        if binding.permission == DENY:
            if binding.operation in (operation, ALL):
                return False
        elif binding.operation in granting:
            allowed = True
    return allowed


def allowed_on_any(bindings: Iterable[AclBinding], principal: str, host: str, resource_type: str, operation: str) -> bool:
    """Whether some resource of the type could be allowed the operation (an
    Allow names it and no Deny refuses it for every name): Kafka's test for
    IdempotentWrite, granted by Write on any topic (KIP-679)."""
    bindings = list(bindings)
    for binding in bindings:
        if (binding.resource_type == resource_type and binding.permission == ALLOW and binding.applies_to(principal, host)
                and binding.operation in (operation, ALL)):
            probe = binding.resource_name
            if authorized(bindings, principal, host, resource_type, probe, operation):
                return True
    return False


@dataclass(frozen=True)
class AclFilter:
    """Which bindings a describe or delete names: None in a field is any
    value. ``pattern_type`` may also be ``ANY`` (either) or ``MATCH``: every
    binding that applies to the LITERAL resource named (its literal name, the
    wildcard, and the prefixes of the name), as Kafka's filter does."""

    resource_type: str | None = None
    pattern_type: str = "ANY"
    resource_name: str | None = None
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None

    def check(self) -> AclFilter:
        if self.resource_type is not None and self.resource_type not in RESOURCE_TYPES:
            raise AclError(f"resource type must be one of {', '.join(RESOURCE_TYPES)}, got {self.resource_type!r}")
        if self.pattern_type not in (*PATTERN_TYPES, "ANY", "MATCH"):
            raise AclError(f"pattern type must be LITERAL, PREFIXED, ANY or MATCH, got {self.pattern_type!r}")
        if self.pattern_type == "MATCH" and (self.resource_type is None or self.resource_name is None):
            raise AclError("a MATCH filter names the resource type and name it matches")
        if self.operation is not None and self.operation not in OPERATIONS:
            raise AclError(f"operation must be one of {', '.join(OPERATIONS)}, got {self.operation!r}")
        if self.permission is not None and self.permission not in PERMISSIONS:
            raise AclError(f"permission must be Allow or Deny, got {self.permission!r}")
        if self.principal is not None:
            check_principal(self.principal)
        return self

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type is not None and binding.resource_type != self.resource_type:
            return False
        if self.pattern_type == "MATCH":
            if not binding.matches_resource(self.resource_type, self.resource_name):
                return False
        else:
            if self.pattern_type != "ANY" and binding.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and binding.resource_name != self.resource_name:
                return False
        return all(wanted is None or wanted == actual for wanted, actual in (
            (self.principal, binding.principal), (self.host, binding.host),
            (self.operation, binding.operation), (self.permission, binding.permission)))


def encode_entries(bindings: Iterable[AclBinding]) -> bytes:
    """One resource pattern's znode: its bindings' entries, sorted, JSON."""
    return json.dumps(sorted((b.encode_entry() for b in bindings), key=lambda e: sorted(e.items()))).encode()


def decode_entries(resource_type: str, pattern_type: str, resource_name: str, data: bytes) -> list[AclBinding]:
    return [AclBinding(resource_type, pattern_type, resource_name, **entry) for entry in json.loads(data or b"[]")]


def describe(binding: AclBinding) -> str:
    """A binding as the CLI prints it."""
    return json.dumps(asdict(binding), sort_keys=True)


# --- the wire form (partition.proto's AclBinding and AclBindingFilter) -----------------

def _proto_name(prefix: str, name: str) -> str:
    return prefix + re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


_TYPES = {t: partition_pb2.AclResourceType.Value(_proto_name("ACL_RESOURCE_TYPE_", t)) for t in RESOURCE_TYPES}
_PATTERNS = {p: partition_pb2.AclPatternType.Value("ACL_PATTERN_TYPE_" + p) for p in (*PATTERN_TYPES, "ANY", "MATCH")}
_OPERATIONS = {o: partition_pb2.AclOperation.Value(_proto_name("ACL_OPERATION_", o)) for o in OPERATIONS}
_PERMISSIONS = {p: partition_pb2.AclPermission.Value(_proto_name("ACL_PERMISSION_", p)) for p in PERMISSIONS}


def _from_proto(table: dict[str, int], value: int, what: str, *, optional: bool = False) -> str | None:
    for name, number in table.items():
        if number == value:
            return name
    if value == 0 and optional:
        return None
    raise AclError(f"{what} must be set to one of {', '.join(table)}, got {value}")


def binding_from_proto(message: partition_pb2.AclBinding) -> AclBinding:
    """The binding, checked: AclError names the field that is wrong or missing."""
    pattern = _from_proto(_PATTERNS, message.pattern_type, "pattern_type")
    if pattern not in PATTERN_TYPES:
        raise AclError(f"a binding's pattern_type is LITERAL or PREFIXED, got {pattern}")
    return AclBinding(_from_proto(_TYPES, message.resource_type, "resource_type"), pattern, message.resource_name,
                      message.principal, message.host, _from_proto(_OPERATIONS, message.operation, "operation"),
                      _from_proto(_PERMISSIONS, message.permission, "permission")).check()


def binding_to_proto(binding: AclBinding) -> partition_pb2.AclBinding:
    return partition_pb2.AclBinding(
        resource_type=_TYPES[binding.resource_type], pattern_type=_PATTERNS[binding.pattern_type],
        resource_name=binding.resource_name, principal=binding.principal, host=binding.host,
        operation=_OPERATIONS[binding.operation], permission=_PERMISSIONS[binding.permission])


def filter_from_proto(message: partition_pb2.AclBindingFilter) -> AclFilter:
    return AclFilter(
        _from_proto(_TYPES, message.resource_type, "resource_type", optional=True),
        _from_proto(_PATTERNS, message.pattern_type, "pattern_type", optional=True) or "ANY",
        message.resource_name if message.HasField("resource_name") else None,
        message.principal if message.HasField("principal") else None,
        message.host if message.HasField("host") else None,
        _from_proto(_OPERATIONS, message.operation, "operation", optional=True),
        _from_proto(_PERMISSIONS, message.permission, "permission", optional=True)).check()


def filter_to_proto(wanted: AclFilter) -> partition_pb2.AclBindingFilter:
    message = partition_pb2.AclBindingFilter(
        resource_type=_TYPES.get(wanted.resource_type, 0), pattern_type=_PATTERNS[wanted.pattern_type],
        operation=_OPERATIONS.get(wanted.operation, 0), permission=_PERMISSIONS.get(wanted.permission, 0))
    for field in ("resource_name", "principal", "host"):
        if getattr(wanted, field) is not None:
            setattr(message, field, getattr(wanted, field))
    return message
