"""The distribution's split (pyproject.toml extras): the client needs neither
the `service` nor the `spark` extra, the services need no `spark` extra, and
none needs the dev tools. Checked by importing each entry point in a fresh
interpreter where the packages of the missing extras cannot be imported."""

import subprocess
import sys
import textwrap

import pytest

SPARK = ["pyspark", "pandas", "pyarrow", "py4j"]
SERVICE = ["kazoo", "rocksdict"]
DEV = ["grpc_tools", "pytest", "hypothesis", "testcontainers"]

IMPORT_WITHOUT = textwrap.dedent("""
    import importlib, sys
    blocked = set(sys.argv[1].split(","))
    class Missing:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r} (not installed with these extras)", name=name)
    sys.meta_path.insert(0, Missing())
    for module in sys.argv[2:]:
        importlib.import_module(module)
    print("imported", len(sys.argv) - 2)
""")


def import_without(blocked: list[str], modules: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", IMPORT_WITHOUT, ",".join(blocked), *modules],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("blocked, modules", [
    (SPARK + SERVICE + DEV, ["txlog", "txlog.cli"]),  # the base install
    (SPARK + DEV, ["partition_svc.server", "coordinator_svc.server", "producer_id_svc.server",
                   "services.cluster", "services.chaos.run"]),  # txlog[service]
    (DEV, ["spark_jobs.eos", "spark_jobs.windowed_counts"]),  # txlog[service,spark]
])
def test_each_install_imports_without_the_extras_it_does_not_name(blocked, modules):
    done = import_without(blocked, modules)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_blocker_does_block():
    done = import_without(SPARK, ["spark_jobs.eos"])
    assert done.returncode != 0 and "not installed with these extras" in done.stderr
