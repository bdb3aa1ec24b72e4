"""The layers of the code base, as an import contract (docs/design.md,
"Layout"). Every import statement counts, at any depth and under
TYPE_CHECKING too:

- the SDK (``txlog``) imports nothing of the services, their shared code or
  the Spark jobs: a client install has none of them;
- the three services never import each other, and take from the SDK only
  what both sides share: ``txlog.protocol``, ``txlog.v1`` (the stubs),
  ``txlog.net`` and ``txlog.errors``;
- the services' shared code (``services.runtime``, ``.security``,
  ``.coordination``) imports none of the services, the Spark jobs or the tooling;
- nothing imports the tooling (``services.tooling``: the local cluster, the
  chaos tool, the stub generator) but the tooling itself, the CLI's local
  commands (by name, at run time), tests, benchmarks and scripts;
- no two modules import each other;
- a pure core (``*_core.py``) imports no I/O, clock, randomness or
  concurrency: not asyncio, threading, time, random, grpc, kazoo or
  rocksdict, itself or through its own service's modules it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("txlog", "services", "coordinator_svc", "partition_svc", "producer_id_svc", "spark_jobs")
SERVICES = ("coordinator_svc", "partition_svc", "producer_id_svc")
SHARED_WITH_SDK = ("txlog.protocol", "txlog.v1", "txlog.net", "txlog.errors", "txlog.release")
NOT_IN_A_CORE = ("asyncio", "threading", "time", "random", "grpc", "kazoo", "rocksdict")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every module an import statement of ``path`` names: ``from a import b`` names a.b when that is one
    of ``modules`` (a submodule), else a."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Each of the repository's modules and the modules it imports."""
    files = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    return {name: imports_of(path, set(files)) for name, path in files.items()}


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def offending(graph, importers, forbidden, allowed=()) -> list[str]:
    """``importers``: package names (their modules at any depth), or a set of exact module names."""
    def importing(module: str) -> bool:
        return module in importers if isinstance(importers, set) else within(module, *importers)

    return sorted(f"{module} imports {target}" for module, targets in graph.items() if importing(module)
                  for target in targets if within(target, *forbidden) and not within(target, *allowed))


def test_the_sdk_imports_none_of_the_services_or_the_spark_jobs(graph):
    assert offending(graph, ["txlog"], ["services", *SERVICES, "spark_jobs"]) == []


def test_the_services_never_import_each_other_nor_the_sdks_internals(graph):
    for service in SERVICES:
        others = [s for s in SERVICES if s != service]
        assert offending(graph, [service], [*others, "spark_jobs"]) == []
        assert offending(graph, [service], ["txlog"], allowed=SHARED_WITH_SDK) == []


def test_the_shared_service_code_imports_no_service_spark_job_or_tool(graph):
    shared = ["services.runtime", "services.security", "services.coordination"]
    assert offending(graph, shared, [*SERVICES, "spark_jobs", "services.tooling"]) == []
    assert offending(graph, shared, ["txlog"], allowed=SHARED_WITH_SDK) == []


def test_nothing_imports_the_tooling_but_the_tooling(graph):
    others = {m for m in graph if not within(m, "services.tooling")}
    assert offending(graph, others, ["services.tooling"]) == []


def test_no_two_modules_import_each_other(graph):
    circles = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets
                      if b != a and b in graph and a in graph[b]})
    assert circles == []


def test_the_pure_cores_import_no_io_clock_randomness_or_concurrency(graph):
    """Directly, or through the modules of their own service they import. (The error model they raise,
    txlog.protocol.errors, imports grpc for its status table: a mapping, not a call.)"""
    cores = [m for m in graph if m.rpartition(".")[2].endswith("_core")]
    assert {"partition_svc.partition_core", "partition_svc.log_core", "coordinator_svc.transaction_core"} <= set(cores)
    for core in cores:
        service = core.partition(".")[0]
        reached, todo = set(), [core]
        while todo:
            for target in graph.get(todo.pop(), ()):
                if target not in reached:
                    reached.add(target)
                    if within(target, service):
                        todo.append(target)
        assert sorted(m for m in reached if within(m, *NOT_IN_A_CORE)) == [], core


def test_the_contract_sees_what_it_checks(graph):
    """A broken parse would pass every test above: the graph holds the known edges."""
    assert "partition_svc.partition_core" in graph["partition_svc.partition"]
    assert "services.runtime.server" in graph["partition_svc.server"]
    assert "asyncio" in graph["partition_svc.write_queue"]
