"""Strict JSON schemas of the Prometheus Operator objects the chart renders
(monitoring.coreos.com/v1 ServiceMonitor, PodMonitor and PrometheusRule), for
the fields it uses, after the operator's CRDs: kubernetes_validate knows only
Kubernetes' own kinds, and a misspelt field in a CRD object is silently
dropped by the API server (a scrape interval or an alert's `for` lost without
a word), so these are checked as strictly as the rest."""

from __future__ import annotations

import jsonschema

# The operator's Duration: Prometheus' duration syntax (the CRDs' pattern), not empty.
_DURATION = {"type": "string", "minLength": 1,
             "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_LABEL_NAME = {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_K8S_LABELS = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}}
_METADATA = {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 253}, "labels": _K8S_LABELS}}
_LABEL_SELECTOR = {"type": "object", "minProperties": 1, "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"], "additionalProperties": False, "properties": {
            "key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
            "values": {"type": "array", "items": {"type": "string"}}}}}}}
_ACTIONS = ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap", "LabelMap",
            "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase", "uppercase", "Uppercase",
            "keepequal", "KeepEqual", "dropequal", "DropEqual"]
_RELABELING = {"type": "object", "additionalProperties": False, "properties": {
    "action": {"enum": _ACTIONS}, "sourceLabels": {"type": "array", "items": _LABEL_NAME},
    "separator": {"type": "string"}, "targetLabel": {"type": "string", "minLength": 1},
    "regex": {"type": "string"}, "modulus": {"type": "integer", "minimum": 0}, "replacement": {"type": "string"}}}
# One scrape endpoint: a named port (the Service's for a ServiceMonitor, the container's for a PodMonitor).
_ENDPOINT = {"type": "object", "required": ["port"], "additionalProperties": False, "properties": {
    "port": {"type": "string", "minLength": 1}, "path": {"type": "string", "pattern": "^/"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]}, "interval": _DURATION, "scrapeTimeout": _DURATION,
    "honorLabels": {"type": "boolean"}, "relabelings": {"type": "array", "items": _RELABELING}}}


def _kind(kind: str, spec: dict) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
                           "metadata": _METADATA, "spec": spec}}


SERVICE_MONITOR = _kind("ServiceMonitor", {
    "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False, "properties": {
        "selector": _LABEL_SELECTOR, "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
        "jobLabel": {"type": "string"}}})
POD_MONITOR = _kind("PodMonitor", {
    "type": "object", "required": ["selector", "podMetricsEndpoints"], "additionalProperties": False, "properties": {
        "selector": _LABEL_SELECTOR, "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
        "jobLabel": {"type": "string"}}})
_ALERTING_RULE = {
    "type": "object", "required": ["alert", "expr"], "additionalProperties": False, "properties": {
        "alert": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}, "expr": {"type": "string", "minLength": 1},
        "for": _DURATION, "keep_firing_for": _DURATION,
        "labels": {"type": "object", "propertyNames": _LABEL_NAME, "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "propertyNames": _LABEL_NAME, "additionalProperties": {"type": "string"}}}}
_RECORDING_RULE = {
    "type": "object", "required": ["record", "expr"], "additionalProperties": False, "properties": {
        "record": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"}, "expr": {"type": "string", "minLength": 1},
        "labels": _STRING_MAP}}
PROMETHEUS_RULE = _kind("PrometheusRule", {
    "type": "object", "required": ["groups"], "additionalProperties": False, "properties": {
        "groups": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "rules"], "additionalProperties": False, "properties": {
                "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                "rules": {"type": "array", "minItems": 1, "items": {"oneOf": [_ALERTING_RULE, _RECORDING_RULE]}}}}}}})
SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PodMonitor": POD_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def validate(doc: dict) -> None:
    """Raises jsonschema.ValidationError for a field the operator does not have or a wrong value."""
    jsonschema.validate(doc, SCHEMAS[doc["kind"]])
    if doc["kind"] == "PrometheusRule":
        names = [group["name"] for group in doc["spec"]["groups"]]
        if len(names) != len(set(names)):  # the CRD's list-map key: group names are unique
            raise jsonschema.ValidationError(f"duplicate rule group names: {names}")
