"""Strict JSON schemas of the cert-manager objects the chart renders
(cert-manager.io/v1 Issuer and Certificate), for the fields it uses, after
cert-manager's API reference: kubernetes_validate knows only Kubernetes' own
kinds, and a misspelt field in a CRD object is silently dropped by the API
server, so these are checked as strictly as the rest."""

from __future__ import annotations

import jsonschema

_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_METADATA = {"type": "object", "required": ["name"], "properties": {"name": _NAME, "labels": {"type": "object"}},
             "additionalProperties": False}
_ISSUER_REF = {"type": "object", "required": ["name"], "additionalProperties": False,
               "properties": {"name": _NAME, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": {"type": "string"}}}
_DURATION = {"type": "string", "pattern": "^[0-9]+(h|m|s)$"}
_USAGES = ["signing", "digital signature", "content commitment", "key encipherment", "key agreement", "data encipherment",
           "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth", "client auth", "code signing",
           "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
           "microsoft sgc", "netscape sgc"]

CERTIFICATE = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Certificate"}, "metadata": _METADATA,
        "spec": {
            "type": "object", "required": ["secretName", "issuerRef"], "additionalProperties": False,
            "properties": {
                "commonName": {"type": "string", "maxLength": 64}, "secretName": _NAME, "isCA": {"type": "boolean"},
                "duration": _DURATION, "renewBefore": _DURATION,
                "dnsNames": {"type": "array", "items": {"type": "string", "minLength": 1}},
                "usages": {"type": "array", "items": {"enum": _USAGES}},
                "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                    "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]}, "size": {"type": "integer"},
                    "rotationPolicy": {"enum": ["Never", "Always"]}, "encoding": {"enum": ["PKCS1", "PKCS8"]}}},
                "issuerRef": _ISSUER_REF,
            },
        },
    },
}
ISSUER = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Issuer"}, "metadata": _METADATA,
        "spec": {"type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": False, "properties": {
            "selfSigned": {"type": "object", "additionalProperties": False},
            "ca": {"type": "object", "required": ["secretName"], "additionalProperties": False, "properties": {"secretName": _NAME}},
        }},
    },
}
SCHEMAS = {"Certificate": CERTIFICATE, "Issuer": ISSUER}


def validate(doc: dict) -> None:
    """Raises jsonschema.ValidationError for a field cert-manager does not have or a wrong value."""
    jsonschema.validate(doc, SCHEMAS[doc["kind"]])
