"""The distribution's split (pyproject.toml extras): the client needs neither
the `service` nor the `spark` extra, the services need no `spark` extra, and
none needs the dev tools. Checked by importing each entry point in a fresh
interpreter where the packages of the missing extras cannot be imported.
The release wheels' split (scripts/build_wheels.py) is checked here too;
tests/integ/test_client_wheel.py builds and installs the client wheel."""

import importlib.util
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
                   "services.tooling.cluster", "services.tooling.chaos.run"]),  # txlog[service]
    (DEV, ["spark_jobs.eos", "spark_jobs.windowed_counts"]),  # txlog[service,spark]
])
def test_each_install_imports_without_the_extras_it_does_not_name(blocked, modules):
    done = import_without(blocked, modules)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_blocker_does_block():
    done = import_without(SPARK, ["spark_jobs.eos"])
    assert done.returncode != 0 and "not installed with these extras" in done.stderr


# The release wheels (scripts/build_wheels.py): two distributions generated from the root pyproject.

def build_wheels_module():
    spec = importlib.util.spec_from_file_location("build_wheels", ROOT / "scripts" / "build_wheels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_two_distributions_hold_every_package_of_the_tree_once_and_the_client_only_txlog():
    build_wheels = build_wheels_module()
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tree = {pattern.removesuffix("*") for pattern in root["tool"]["setuptools"]["packages"]["find"]["include"]}
    by_dist = {dist.name: dist.packages for dist in build_wheels.DISTRIBUTIONS}
    assert by_dist["txlog"] == ("txlog",), "the client wheel holds no top-level package besides txlog"
    shipped = [package for packages in by_dist.values() for package in packages]
    assert sorted(shipped) == sorted(tree), "each package of the development install in exactly one wheel"


def test_each_generated_pyproject_takes_its_version_and_dependencies_from_the_root():
    build_wheels = build_wheels_module()
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client, service = (tomllib.loads(build_wheels.pyproject_text(dist, root))["project"]
                       for dist in build_wheels.DISTRIBUTIONS)
    version = root["version"]
    assert client["version"] == service["version"] == version
    assert client["dependencies"] == root["dependencies"] and client["scripts"] == root["scripts"]
    assert client["optional-dependencies"] == {"service": [f"txlog-service=={version}"],
                                               "spark": [f"txlog-service[spark]=={version}"]}
    assert service["dependencies"] == [f"txlog=={version}", *root["optional-dependencies"]["service"]]
    assert service["optional-dependencies"] == {"spark": root["optional-dependencies"]["spark"]}
