"""The client-only install, as a user gets it: the `txlog` wheel built by
scripts/build_wheels.py, installed into a fresh virtual environment (its
dependencies from PyPI, through pip's cache), beside an application that has a
top-level `services` package of its own. The application imports both, and
produces and consumes a record through the client-only environment against a
real local cluster (run from the development install): the client needs none
of the service packages, and puts none on the application's path.

Slow the first time on a machine (pip downloads the dependencies); the
environment is built once (a module fixture: its tests share one worker)."""

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SERVICE_PACKAGES = {"services", "coordinator_svc", "partition_svc", "producer_id_svc", "spark_jobs"}

BILLING = '''
"""The application's own services package: nothing to do with txlog's."""

def invoice_line(customer: str, cents: int) -> bytes:
    return f"{customer}:{cents}".encode()
'''

APP = '''
import sys

import services.billing
import txlog
import txlog.errors
from txlog import Admin, Consumer, Producer, TransactionChecker

bootstrap = sys.argv[1]
assert services.billing.__file__.startswith(sys.argv[2]), services.billing.__file__
assert TransactionChecker.__module__.startswith("txlog"), TransactionChecker
assert issubclass(txlog.errors.ClientTimeoutError, Exception)
with Admin(bootstrap) as admin:
    admin.create_topics([("invoices", 1)])
with Producer(bootstrap) as producer:
    sent = producer.send("invoices", services.billing.invoice_line("acme", 1250)).result(timeout=60)
records = []
with Consumer(bootstrap, fetch_max_wait_ms=100) as consumer:
    consumer.assign([("invoices", 0)])
    try:
        while not records:
            records = consumer.poll(timeout_s=1)
    except txlog.errors.ClientError as exc:
        sys.exit(f"the consumer failed: {exc}")
print("txlog from", txlog.__file__)
print("read", records[0].offset, records[0].value.decode())
'''


def run(command, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def clean_env() -> dict[str, str]:
    """The environment without what points into the development install."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix))
    return env


@pytest.fixture(scope="module")  # module: both tests on one xdist worker, the environment built once
def client_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment holding only the client wheel and its dependencies."""
    scratch = tmp_path_factory.mktemp("client-wheel")
    dist = scratch / "dist"
    built = run([sys.executable, str(REPOSITORY / "scripts" / "build_wheels.py"), "--only", "txlog", "--out", str(dist)])
    (wheel,) = [Path(line) for line in built.stdout.split()]
    assert wheel.name.startswith("txlog-") and wheel.exists()
    venv = scratch / "venv"
    run(["python3.11", "-m", "venv", str(venv)], env=clean_env())
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        env=clean_env())
    return venv


@pytest.fixture
def application(tmp_path) -> Path:
    """An application directory with a top-level `services` package of its own."""
    app = tmp_path / "app"
    (app / "services").mkdir(parents=True)
    (app / "services" / "__init__.py").write_text('"""The application\'s services."""\n')
    (app / "services" / "billing.py").write_text(textwrap.dedent(BILLING))
    (app / "app.py").write_text(textwrap.dedent(APP))
    return app


def site_packages(venv: Path) -> Path:
    purelib = run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  env=clean_env()).stdout.strip()
    assert purelib != sysconfig.get_paths()["purelib"], "the fresh environment, not this one"
    return Path(purelib)


def test_the_client_wheel_installs_only_the_txlog_package(client_venv):
    top_level = {p.name.removesuffix(".py") for p in site_packages(client_venv).iterdir()}
    assert "txlog" in top_level
    assert not SERVICE_PACKAGES & top_level, f"service packages on the client's path: {SERVICE_PACKAGES & top_level}"
    help_text = run([str(client_venv / "bin" / "txlog"), "--help"], env=clean_env()).stdout
    assert "usage: txlog" in help_text


def test_an_application_with_its_own_services_package_uses_the_client_wheel_against_a_cluster(
        client_venv, application, txlog_cluster):
    done = run([str(client_venv / "bin" / "python"), "app.py", txlog_cluster.state.bootstrap, str(application)],
               cwd=application, env=clean_env())
    lines = done.stdout.splitlines()
    assert lines[0].startswith("txlog from " + str(site_packages(client_venv))), lines
    assert lines[1] == "read 0 acme:1250", lines
