"""TLS for every gRPC port and channel, and the principal a peer's
certificate names (issue 15).

Certificates and keys come from PEM files and are read again whenever one of
the files changes (a cert-manager rotation): a server hands each new
handshake the newest pair without a restart, and a client opens its next
channels with the newest files. Connections already open keep theirs, as TLS
does.

The principal of a client certificate is its subject, as gRPC reports it
(RFC 2253, e.g. ``CN=alice,O=team``), rewritten by principal mapping rules in
Kafka's ``ssl.principal.mapping.rules`` syntax: ``RULE:pattern/replacement/``
(optionally ``/L`` or ``/U`` after it to lower or upper the result) tried in
order, the first whose pattern matches the whole subject wins; ``DEFAULT``
takes the subject as it is. The default rules map a subject that is only a
common name to that name (``CN=alice`` -> ``User:alice``) and anything else
to the whole subject.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

import grpc

from txlog.errors import ConfigError

log = logging.getLogger(__name__)

CLIENT_AUTH_CHOICES = ("required", "none")
DEFAULT_PRINCIPAL_MAPPING_RULES = "RULE:^CN=([^,]+)$/$1/,DEFAULT"
USER = "User:"
ANONYMOUS = "User:ANONYMOUS"


class TlsConfigError(ConfigError):
    """TLS files or settings that cannot be used, saying which and why."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM file paths: the CA bundle that verifies peers, and this side's
    certificate chain and key (a client may go without, if the server does
    not require one); and a client's bearer token file (services/security/tokens.py),
    sent with every call, re-read when it changes, only over TLS."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    token: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert or self.key)

    def check(self, *, server: bool) -> None:
        if bool(self.cert) != bool(self.key):
            raise TlsConfigError("a TLS certificate and its key go together: give both tls_cert and tls_key, or neither")
        if server and self.enabled and not self.cert:
            raise TlsConfigError("a TLS server needs tls_cert and tls_key")
        if self.token and not self.ca:
            raise TlsConfigError("a bearer token is sent only over TLS: give tls_ca (the CA that verifies the servers) too")
        for name in ("ca", "cert", "key"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                raise TlsConfigError(f"tls_{name} {path!r} is not a readable file")
        if self.token and not os.access(self.token, os.R_OK):
            raise TlsConfigError(f"token_file {self.token!r} is not a readable file")

    def stamp(self) -> tuple:
        """Changes whenever one of the files is replaced or rewritten."""
        stamps = []
        for path in (self.ca, self.cert, self.key):
            try:
                stat = os.stat(path) if path else None
            except OSError:
                stat = None
            stamps.append((stat.st_mtime_ns, stat.st_size, stat.st_ino) if stat else None)
        return tuple(stamps)

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(ca, cert, key) contents; TlsConfigError naming a file that cannot be read or is not PEM."""
        contents = []
        for name in ("ca", "cert", "key"):
            path = getattr(self, name)
            if not path:
                contents.append(None)
                continue
            try:
                with open(path, "rb") as file:
                    data = file.read()
            except OSError as exc:
                raise TlsConfigError(f"tls_{name} {path!r} cannot be read: {exc.strerror}") from None
            if b"-----BEGIN " not in data:
                raise TlsConfigError(f"tls_{name} {path!r} is not a PEM file")
            contents.append(data)
        return contents[0], contents[1], contents[2]


def files_from(cfg) -> TlsFiles:
    """The TLS files (and token) a service's settings name."""
    return TlsFiles(getattr(cfg, "tls_ca", ""), getattr(cfg, "tls_cert", ""), getattr(cfg, "tls_key", ""),
                    getattr(cfg, "token_file", ""))


def server_credentials(files: TlsFiles, client_auth: str) -> grpc.ServerCredentials:
    """Credentials that give every new handshake the newest certificate and
    CA on disk; ``client_auth`` "required" refuses clients without a
    certificate the CA signed."""
    files.check(server=True)
    if client_auth not in CLIENT_AUTH_CHOICES:
        raise TlsConfigError(f"tls_client_auth must be one of {CLIENT_AUTH_CHOICES}, got {client_auth!r}")
    if client_auth == "required" and not files.ca:
        raise TlsConfigError("tls_client_auth=required needs tls_ca, the CA that signs client certificates")

    def configuration() -> grpc.ServerCertificateConfiguration:
        ca, cert, key = files.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    current = {"stamp": files.stamp()}
    initial = configuration()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        stamp = files.stamp()
        if stamp == current["stamp"]:
            return None
        try:
            fresh = configuration()
        except TlsConfigError as exc:  # half-written during a rotation: keep the last good one, try again next handshake
            log.warning("TLS files changed but cannot be used yet: %s", exc)
            return None
        current["stamp"] = stamp
        log.info("TLS certificate reloaded", extra={"fields": {"cert": files.cert}})
        return fresh

    return grpc.dynamic_ssl_server_credentials(initial, fetch, require_client_authentication=client_auth == "required")


class ChannelCredentials:
    """Client credentials from ``files``, made again once the files change
    (callers open new channels when :meth:`changed` says so)."""

    def __init__(self, files: TlsFiles):
        files.check(server=False)
        self.files = files
        self._stamp = None
        self._credentials: grpc.ChannelCredentials | None = None

    def get(self) -> grpc.ChannelCredentials:
        stamp = self.files.stamp()
        if self._credentials is None or stamp != self._stamp:
            ca, cert, key = self.files.read()
            credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
            if self.files.token:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.metadata_call_credentials(BearerToken(self.files.token), name="txlog-bearer-token"))
            self._credentials = credentials
            self._stamp = stamp
        return self._credentials

    def changed(self) -> bool:
        return self._stamp is not None and self.files.stamp() != self._stamp


class BearerToken(grpc.AuthMetadataPlugin):
    """``authorization: Bearer <the token file's contents>`` on every call;
    the file is read again when it changes (a refreshed token)."""

    def __init__(self, path: str):
        self.path = path
        self._stamp = None
        self._header = ""

    def __call__(self, context, callback) -> None:
        try:
            stat = os.stat(self.path)
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if stamp != self._stamp:
                with open(self.path) as file:
                    self._header, self._stamp = "Bearer " + file.read().strip(), stamp
        except OSError as exc:
            if not self._header:
                callback((), TlsConfigError(f"token_file {self.path!r} cannot be read: {exc.strerror}"))
                return
        callback((("authorization", self._header),), None)


# --- principals ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MappingRule:
    pattern: re.Pattern | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "", "L" or "U"

    def apply(self, subject: str) -> str | None:
        if self.pattern is None:
            return subject
        match = self.pattern.fullmatch(subject)
        if match is None:
            return None
        # $1 .. $9 as in Kafka's rules
        result = re.sub(r"\$(\d)", lambda m: match.group(int(m.group(1))) or "", self.replacement)
        return result.lower() if self.case == "L" else result.upper() if self.case == "U" else result


_RULE = re.compile(r"RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?)")


def parse_mapping_rules(text: str) -> tuple[MappingRule, ...]:
    """Kafka's ssl.principal.mapping.rules: ``RULE:p/r/[L|U]`` and ``DEFAULT``,
    separated by commas (a comma inside a rule's pattern is part of it)."""
    rules: list[MappingRule] = []
    rest = text.strip()
    while rest:
        if rest.startswith("DEFAULT"):
            rules.append(MappingRule(None))
            rest = rest[len("DEFAULT"):]
        else:
            match = _RULE.match(rest)
            if match is None:
                raise TlsConfigError(f"principal mapping rules: cannot read {rest[:60]!r} (expected RULE:pattern/replacement/[L|U] or DEFAULT)")
            try:
                pattern = re.compile(match.group(1).replace("\\/", "/"))
            except re.error as exc:
                raise TlsConfigError(f"principal mapping rules: bad pattern {match.group(1)!r}: {exc}") from None
            rules.append(MappingRule(pattern, match.group(2).replace("\\/", "/"), match.group(3)))
            rest = rest[match.end():]
        rest = rest.lstrip()
        if rest.startswith(","):
            rest = rest[1:].lstrip()
        elif rest:
            raise TlsConfigError(f"principal mapping rules: expected a comma before {rest[:60]!r}")
    if not rules:
        raise TlsConfigError("principal mapping rules are empty; DEFAULT takes the certificate's subject as it is")
    return tuple(rules)


def principal_of_subject(subject: str, rules: tuple[MappingRule, ...]) -> str | None:
    """``User:<name>`` for a certificate subject, or None when no rule matches."""
    for rule in rules:
        name = rule.apply(subject)
        if name is not None:
            return USER + name
    return None


def certificate_subject(auth_context: dict) -> str | None:
    """The verified client certificate's subject from a call's auth context (None: no certificate)."""
    subjects = auth_context.get("x509_subject") or []
    return subjects[0].decode() if subjects else None
