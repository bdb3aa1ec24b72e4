"""The authorizer: who is calling, and whether they may (issue 15).

Identity: the principal of a call is taken from its bearer token
(``authorization: Bearer <JWT>``, verified against ``--jwt-jwks-file``:
services/security/tokens.py), else from the client certificate TLS verified (its
subject through the principal mapping rules, txlog/net/tls.py); a server
that takes tokens refuses a call with neither (AUTHENTICATION_FAILED,
gRPC UNAUTHENTICATED), and one that authenticates nobody (plaintext, or TLS
without client certificates or tokens) calls the caller ``User:ANONYMOUS``.
The host is the peer's IP address. gRPC Python cannot ask for a client
certificate without requiring one, so a port authenticates either by
certificate (tls_client_auth=required) or by token (tls_client_auth=none
with a JWKS file; the services then carry tokens too: --token-file).

ACLs live in ZooKeeper (:class:`AclStore`) and every instance keeps them all
in memory (:class:`AclCache`), loaded before it serves and again whenever
``<root>/acl_changes`` changes (a watch; every ACL change writes it after
its own writes), so a grant or a revocation reaches every instance within
moments, as Kafka's ZooKeeper-mode authorizer did.

With ``--authorizer acl`` every RPC of txlog's services is checked before
its handler runs, against services/security/access.py's table: a super user
(``--super-users``; the services' own principals must be among them, since
they call one another) may do anything; anyone else needs an ACL that allows
and none that denies. A refusal is logged (principal, host, resource,
operation) and answered with the resource type's *_AUTHORIZATION_FAILED
code (gRPC PERMISSION_DENIED). Health and reflection are not checked.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import posixpath
from collections.abc import Iterable
from urllib.parse import quote, unquote

import grpc
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from services.coordination import zk
from services.runtime.logs import fields
from services.security import access, tokens
from txlog.net import tls
from txlog.net.identity import PEER_METADATA, metadata_value
from txlog.protocol import acls, errors
from txlog.protocol.acls import AclBinding, AclFilter
from txlog.protocol.errors import ErrorCode, TxlogError

log = logging.getLogger(__name__)

AUTHORIZER_CHOICES = ("none", "acl")
DECISIONS_MAX = 100_000  # cached decisions (and principals) kept before starting afresh


def parse_super_users(text: str) -> frozenset[str]:
    """Kafka's super.users: principals separated by semicolons."""
    users = [u.strip() for u in text.split(";") if u.strip()]
    for user in users:
        try:
            acls.check_principal(user)
        except acls.AclError as exc:
            raise tls.TlsConfigError(f"super_users: {exc}") from None
    return frozenset(users)


def peer_host(peer: str) -> str:
    """The IP address of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        rest = rest[1:rest.index("]")] if rest.startswith("[") else rest.rsplit(":", 1)[0]
    elif kind == "ipv4":
        rest = rest.rsplit(":", 1)[0]
    try:
        return str(ipaddress.ip_address(rest))
    except ValueError:
        return rest


def bearer_token(metadata) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


class AclStore:
    """The bindings in ZooKeeper: ``<root>/acls/<resource type>/<pattern
    type>/<name, percent-encoded>`` holds one resource pattern's entries
    (JSON); every change is a conditional write of that znode (on the version
    read), then a write of ``<root>/acl_changes`` that wakes every cache."""

    def __init__(self, client: KazooClient, root: str):
        self.client = client
        self.base = posixpath.join(root, "acls")
        self.changes = posixpath.join(root, "acl_changes")

    def _path(self, resource_type: str, pattern_type: str, name: str) -> str:
        return posixpath.join(self.base, resource_type, pattern_type, quote(name, safe=""))

    def load(self) -> list[AclBinding]:
        """Every binding (a blocking read: call it off the event loop)."""
        found: list[AclBinding] = []
        for resource_type in acls.RESOURCE_TYPES:
            for pattern_type in acls.PATTERN_TYPES:
                folder = posixpath.join(self.base, resource_type, pattern_type)
                try:
                    children = zk.reply(self.client.get_children_async(folder))
                except NoNodeError:
                    continue
                for child in children:
                    try:
                        data, _ = zk.reply(self.client.get_async(posixpath.join(folder, child)))
                    except NoNodeError:
                        continue
                    found += acls.decode_entries(resource_type, pattern_type, unquote(child), data)
        return found

    async def add(self, bindings: Iterable[AclBinding]) -> None:
        by_pattern: dict[tuple[str, str, str], set[AclBinding]] = {}
        for b in bindings:
            by_pattern.setdefault((b.resource_type, b.pattern_type, b.resource_name), set()).add(b)
        for pattern, added in by_pattern.items():
            await self._update(pattern, lambda current, added=added: current | added)
        await self._announce()

    async def remove(self, filters: list[AclFilter]) -> list[AclBinding]:
        """Removes every binding a filter matches; returns them."""
        removed: list[AclBinding] = []
        for binding in await asyncio.to_thread(self.load):
            if any(f.matches(binding) for f in filters):
                removed.append(binding)
        patterns = {(b.resource_type, b.pattern_type, b.resource_name) for b in removed}
        for pattern in patterns:
            await self._update(pattern, lambda current: {b for b in current if not any(f.matches(b) for f in filters)})
        if removed:
            await self._announce()
        return removed

    async def _update(self, pattern: tuple[str, str, str], change) -> None:
        path = self._path(*pattern)
        while True:
            try:
                data, stat = await zk.call(self.client, "get", path)
            except NoNodeError:
                data, stat = None, None
            current = set(acls.decode_entries(*pattern, data)) if data is not None else set()
            wanted = change(current)
            if wanted == current:
                return
            try:
                if stat is None:
                    await zk.call(self.client, "create", path, acls.encode_entries(wanted), makepath=True)
                elif wanted:
                    await zk.call(self.client, "set", path, acls.encode_entries(wanted), version=stat.version)
                else:
                    await zk.call(self.client, "delete", path, version=stat.version)
                return
            except (BadVersionError, NodeExistsError, NoNodeError, NotEmptyError):
                continue  # another writer came first: read again

    async def _announce(self) -> None:
        await zk.call(self.client, "ensure_path", self.changes)
        await zk.call(self.client, "set", self.changes, json.dumps({"changed": True}).encode())


class AclCache:
    """Every binding, indexed by resource type, reloaded on each change."""

    def __init__(self, store: AclStore):
        self.store = store
        self.by_type: dict[str, tuple[AclBinding, ...]] = {}
        # (principal, host, resource type, name, operation) -> allowed, under the bindings loaded now: a call's
        # checks are dictionary lookups once its principal has made them (bench/security.py: 4-partition
        # produce at 0.71 of plaintext with every check walking 102 bindings)
        self.decisions: dict[tuple[str, str, str, str, str], bool] = {}
        self.loads = 0
        self.on_change = zk.ReloadOnChange(store.client, store.changes, self.reload, "the ACLs")

    async def start(self) -> None:
        await self.reload()
        await self.on_change.start()

    async def reload(self) -> None:
        bindings = await asyncio.to_thread(self.store.load)
        by_type: dict[str, list[AclBinding]] = {}
        for binding in bindings:
            by_type.setdefault(binding.resource_type, []).append(binding)
        self.by_type = {t: tuple(b) for t, b in by_type.items()}
        self.decisions = {}  # made under the old bindings
        self.loads += 1
        log.info("acls loaded", extra=fields(bindings=len(bindings)))

    def all(self) -> list[AclBinding]:
        return [b for bindings in self.by_type.values() for b in bindings]


class Caller:
    """One call's principal and host, and what the ACLs let them do."""

    def __init__(self, principal: str, host: str, authorizer: Authorizer):
        self.principal = principal
        self.host = host
        self._authorizer = authorizer

    def may(self, resource_type: str, name: str, operation: str) -> bool:
        if self.principal in self._authorizer.super_users:
            return True
        cache = self._authorizer.cache
        key = (self.principal, self.host, resource_type, name, operation)
        allowed = cache.decisions.get(key)
        if allowed is None:
            allowed = acls.authorized(cache.by_type.get(resource_type, ()), self.principal, self.host, resource_type, name, operation)
            if len(cache.decisions) >= DECISIONS_MAX:
                cache.decisions = {}
            cache.decisions[key] = allowed
        return allowed

    def may_on_any(self, resource_type: str, operation: str) -> bool:
        if self.principal in self._authorizer.super_users:
            return True
        return acls.allowed_on_any(self._authorizer.cache.by_type.get(resource_type, ()), self.principal, self.host,
                                   resource_type, operation)


class Authorizer:
    def __init__(self, cfg):
        self.enabled = getattr(cfg, "authorizer", "none") == "acl"
        jwks_file = getattr(cfg, "jwt_jwks_file", "")
        try:
            self.tokens = tokens.TokenVerifier(jwks_file, tokens.Expectations(
                getattr(cfg, "jwt_issuer", ""), getattr(cfg, "jwt_audience", ""), getattr(cfg, "jwt_principal_claim", "sub"))
            ) if jwks_file else None
        except tokens.TokenError as exc:
            raise tls.TlsConfigError(f"jwt_jwks_file: {exc}") from None
        self.super_users = parse_super_users(getattr(cfg, "super_users", ""))
        self.mapping_rules = tls.parse_mapping_rules(getattr(cfg, "principal_mapping_rules", tls.DEFAULT_PRINCIPAL_MAPPING_RULES))
        self.store: AclStore | None = None
        self.cache: AclCache | None = None
        self._principals: dict[str, str] = {}  # certificate subject -> principal (the mapping rules are fixed)

    async def start(self, client: KazooClient, root: str) -> None:
        """Loads the ACLs and watches for changes (before the server takes calls)."""
        self.store = AclStore(client, root)
        self.cache = AclCache(self.store)
        if self.enabled:
            await self.cache.start()

    def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """Who calls; TxlogError AUTHENTICATION_FAILED for a token that does
        not verify, or no identity where this server requires one."""
        host = peer_host(context.peer())
        token = bearer_token(context.invocation_metadata())
        if token is not None:
            if self.tokens is None:
                raise TxlogError(ErrorCode.Value("AUTHENTICATION_FAILED"),
                                 "this server takes no bearer tokens (no jwt_jwks_file); authenticate with a client certificate")
            try:
                return Caller(self.tokens.principal(token), host, self)
            except tokens.TokenError as exc:
                raise TxlogError(ErrorCode.Value("AUTHENTICATION_FAILED"), f"the bearer token is refused: {exc}") from None
        subject = tls.certificate_subject(context.auth_context())
        if subject is not None:
            principal = self._principals.get(subject)
            if principal is None:
                principal = tls.principal_of_subject(subject, self.mapping_rules) or tls.ANONYMOUS
                if len(self._principals) >= DECISIONS_MAX:
                    self._principals = {}
                self._principals[subject] = principal
            return Caller(principal, host, self)
        if self.tokens is not None:
            raise TxlogError(ErrorCode.Value("AUTHENTICATION_FAILED"),
                             "the call carries neither a client certificate nor a bearer token (authorization: Bearer <JWT>)")
        return Caller(tls.ANONYMOUS, host, self)

    def is_cluster_call(self, context: grpc.aio.ServicerContext) -> bool:
        """A call another instance made (txlog.net.identity's peer mark) by a
        caller that may do anything; with neither authorizer nor tokens,
        any marked call (any caller could be anyone)."""
        if metadata_value(context, PEER_METADATA) is None:
            return False
        if not self.enabled and self.tokens is None:
            return True
        try:
            return self.caller(context).principal in self.super_users
        except TxlogError:
            return False

    def guard(self, method: str, implementation, unchecked: type):
        """``implementation`` checked first (and its answer filtered, for the
        RPCs that list): what generic_handler serves when the authorizer is
        on. A request of type ``unchecked`` (one that did not parse) goes
        straight to the implementation, which refuses it."""
        if not self.enabled and self.tokens is None:
            return implementation
        post_filter = access.FILTERS.get(method) if self.enabled else None

        @functools.wraps(implementation)
        async def guarded(request, context):
            if not isinstance(request, unchecked):
                try:
                    caller = self.caller(context)
                except TxlogError as exc:
                    log.warning("unauthenticated", extra=fields(rpc=method, host=peer_host(context.peer()), error=exc.message))
                    await errors.abort(context, exc)
                refused = access.first_refused(caller, access.needs(method, request, caller)) if self.enabled else None
                if refused is not None:
                    log.warning("refused", extra=fields(rpc=method, principal=caller.principal, host=caller.host,
                                                        resource_type=refused[0], resource=access.shown(refused[1]), operation=refused[2]))
                    await errors.abort(context, access.refusal(caller.principal, refused))
                response = await implementation(request, context)
                if post_filter is not None and response is not None:
                    post_filter(request, response, caller)
                return response
            return await implementation(request, context)

        return guarded

    def check_admin_available(self) -> AclStore:
        if not self.enabled or self.store is None:
            raise TxlogError(ErrorCode.Value("SECURITY_DISABLED"),
                             "this cluster runs without an authorizer (--authorizer none): there are no ACLs to change or list")
        return self.store
