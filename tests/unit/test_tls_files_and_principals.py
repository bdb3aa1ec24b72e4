"""TLS settings, principal mapping rules and the local CA (txlog/net/tls.py,
services/security/certs.py; issue 15)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from services.security import certs
from txlog.net.channels import ChannelCache
from txlog.net.tls import TlsConfigError, TlsFiles, parse_mapping_rules, principal_of_subject

DEFAULT_RULES = parse_mapping_rules("RULE:^CN=([^,]+)$/$1/,DEFAULT")


@pytest.mark.parametrize(("subject", "principal"), [
    ("CN=alice", "User:alice"),
    ("CN=alice,O=team", "User:CN=alice,O=team"),  # not only a common name: the whole subject
    ("O=team,CN=spark-job", "User:O=team,CN=spark-job"),
])
def test_the_default_rules_map_a_lone_common_name_to_its_name_and_anything_else_to_the_subject(subject, principal):
    assert principal_of_subject(subject, DEFAULT_RULES) == principal


def test_rules_apply_in_order_with_groups_and_case_as_kafka_does():
    rules = parse_mapping_rules(r"RULE:^CN=([^,]+),OU=(svc|ops)$/$2:$1/U, RULE:^O=([^,]+),CN=([^,]+)$/$2@$1/L")
    assert principal_of_subject("CN=coord,OU=svc", rules) == "User:SVC:COORD"
    assert principal_of_subject("O=Team,CN=Bob", rules) == "User:bob@team"
    assert principal_of_subject("CN=nobody", rules) is None  # no DEFAULT: unmapped subjects have no principal
    assert principal_of_subject("CN=a/b", parse_mapping_rules(r"RULE:^CN=(.*)\/(.*)$/$2/")) == "User:b"


@pytest.mark.parametrize("text", ["", "RULE:^CN=(.*)$/$1", "DEFAULT DEFAULT", "RULE:([/x/", "SOMETHING"])
def test_unreadable_rules_are_refused_saying_what_was_wrong(text):
    with pytest.raises(TlsConfigError, match="principal mapping rules"):
        parse_mapping_rules(text)


def test_tls_files_that_cannot_work_are_refused_naming_the_setting(tmp_path):
    with pytest.raises(TlsConfigError, match="tls_cert and tls_key"):
        TlsFiles(cert=str(tmp_path / "c.pem")).check(server=False)
    with pytest.raises(TlsConfigError, match="needs tls_cert"):
        TlsFiles(ca=str(tmp_path / "ca.pem")).check(server=True)
    with pytest.raises(TlsConfigError, match="tls_ca .* not a readable file"):
        TlsFiles(ca=str(tmp_path / "missing.pem")).check(server=False)
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(TlsConfigError, match="not a PEM file"):
        TlsFiles(ca=str(tmp_path / "junk.pem")).read()


def test_the_local_ca_issues_certificates_that_openssl_verifies_and_a_new_stamp_on_rotation(tmp_path):
    ca = certs.create_ca(tmp_path)
    cert, key = certs.issue(tmp_path, "partition_svc-0", server=True)
    check = subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    text = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-subject", "-ext", "subjectAltName"],
                          capture_output=True, text=True).stdout
    assert "CN=partition_svc-0" in text.replace(" ", "") and "IP Address:127.0.0.1" in text
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    files = TlsFiles(str(ca), str(cert), str(key))
    before = files.stamp()
    certs.issue(tmp_path, "partition_svc-0", server=True)  # rotated in place
    assert files.stamp() != before
    with pytest.raises(certs.CertificateError, match="certificate name"):
        certs.issue(tmp_path, "../escape")


def test_a_client_opens_new_channels_once_its_certificate_files_change(tmp_path):
    """A rotated client certificate (the services' own, or an SDK user's) is
    used from the next connection on: the cached channel is replaced."""
    certs.create_ca(tmp_path)
    cert, key = certs.issue(tmp_path, "client")
    files = TlsFiles(str(tmp_path / "ca.pem"), str(cert), str(key))

    async def scenario():
        cache = ChannelCache(tls_files=files)
        first = cache.get("127.0.0.1:1")
        assert cache.get("127.0.0.1:1") is first
        certs.issue(tmp_path, "client")  # rotated
        assert cache.get("127.0.0.1:1") is not first
        await cache.close()

    asyncio.run(scenario())


def test_a_service_with_unusable_tls_settings_exits_2_naming_them(tmp_path):
    done = subprocess.run([sys.executable, "-m", "producer_id_svc", "--tls-cert", str(tmp_path / "cert.pem"), "--zookeeper", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "tls_cert and tls_key" in done.stderr, done.stderr[-500:]
