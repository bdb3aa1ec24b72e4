"""docker-compose.yml, the Dockerfile and .dockerignore, checked without a
Docker engine: the compose services, their health checks, volumes, start
order and addresses; the image's stages, user and health check; the build
context. And the transaction the end-to-end test runs through compose, run
here against a local cluster of the same services."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from chart_render import REPO, settings_read_by

COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
ONE_TRANSACTION = Path(__file__).with_name("one_transaction.py")

KINDS = {"producer_id_svc": 7100, "coordinator_svc": 7200, "partition_svc": 7300}
EXPECTED = {
    "producer-id-svc": "producer_id_svc",
    "partition-svc-0": "partition_svc",
    "partition-svc-1": "partition_svc",
    "partition-svc-2": "partition_svc",
    "coordinator-svc-0": "coordinator_svc",
    "coordinator-svc-1": "coordinator_svc",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())  # PyYAML resolves the `<<` merge keys as Compose does


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", duration)
    assert match, duration
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[match.group(2)]


def kind_of(service: dict) -> str:
    command = service["command"]
    assert command[:2] == ["python", "-m"], command
    return command[2]


# --- docker-compose.yml -------------------------------------------------------------------------------


def test_compose_has_zookeeper_the_services_and_the_spark_job(services):
    assert set(services) == {"zookeeper", "windowed-counts", *EXPECTED}
    # the official image unless TXLOG_ZOOKEEPER_IMAGE names another (make image builds one from Debian's packages)
    assert re.fullmatch(r"\$\{TXLOG_ZOOKEEPER_IMAGE:-zookeeper:[0-9.]+\}", services["zookeeper"]["image"])
    for name, kind in EXPECTED.items():
        assert kind_of(services[name]) == kind, name


def test_every_long_running_service_is_health_checked(services):
    assert services["zookeeper"]["healthcheck"]["test"][:3] == ["CMD", "bash", "-c"]
    assert "echo srvr" in services["zookeeper"]["healthcheck"]["test"][3]
    assert "srvr" in services["zookeeper"]["environment"]["ZOO_4LW_COMMANDS_WHITELIST"].split(",")
    for name in EXPECTED:
        check = services[name]["healthcheck"]
        assert check["test"] == ["CMD", "python", "/opt/txlog/healthcheck.py"], name
        assert seconds(check["timeout"]) <= seconds(check["interval"])
        # the script finds the service through TXLOG_LISTEN
        assert "TXLOG_LISTEN" in services[name]["environment"]
    assert services["windowed-counts"]["healthcheck"] == {"disable": True}


def test_node_ids_are_unique_per_kind_and_addresses_name_the_service_and_its_port(services):
    seen: dict[str, set[str]] = {}
    for name, kind in EXPECTED.items():
        env = services[name]["environment"]
        assert env["TXLOG_NODE_ID"] not in seen.setdefault(kind, set()), f"{name} reuses a {kind} node id"
        seen[kind].add(env["TXLOG_NODE_ID"])
        listen_port = int(env["TXLOG_LISTEN"].rsplit(":", 1)[1])
        assert listen_port == KINDS[kind]
        assert env["TXLOG_ADVERTISED_ADDRESS"] == f"{name}:{listen_port}"
        assert env["TXLOG_ZOOKEEPER"] == "zookeeper:2181"
        assert env["TXLOG_OTEL_EXPORTER"].startswith("${TXLOG_OTEL_EXPORTER:-")
        assert "TXLOG_OTEL_ENDPOINT" in env
    assert {k: len(v) for k, v in seen.items()} == {"producer_id_svc": 1, "partition_svc": 3, "coordinator_svc": 2}


def test_every_txlog_variable_given_is_a_setting_the_process_reads(services):
    for name, service in services.items():
        if name == "zookeeper":
            continue
        module = service["command"][2]
        given = {key for key in service["environment"] if key.startswith("TXLOG_")}
        assert given <= settings_read_by(module), (name, given - settings_read_by(module))


def test_each_partition_svc_keeps_its_data_dir_on_a_named_volume_of_its_own(compose, services):
    declared = set(compose["volumes"])
    used = []
    for name, kind in EXPECTED.items():
        if kind != "partition_svc":
            assert "volumes" not in services[name], f"{name} keeps no data"
            continue
        data_dir = services[name]["environment"]["TXLOG_DATA_DIR"]
        [mount] = services[name]["volumes"]
        volume, target = mount.split(":")
        assert volume in declared
        assert data_dir.startswith(target.rstrip("/") + "/")
        used.append(volume)
    assert len(used) == len(set(used)) == 3
    zookeeper_volumes = dict(m.split(":")[::-1] for m in services["zookeeper"]["volumes"])
    assert set(zookeeper_volumes) == {"/data", "/datalog"}
    assert set(zookeeper_volumes.values()) <= declared


def test_start_order_is_gated_on_health_and_has_no_cycle(services):
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert condition == {"condition": "service_healthy"}, (name, dependency)
            assert "healthcheck" in services[dependency] and services[dependency]["healthcheck"] != {"disable": True}
    for name in ("producer-id-svc", "partition-svc-0", "partition-svc-1", "partition-svc-2"):
        assert set(services[name]["depends_on"]) == {"zookeeper"}
    for name in ("coordinator-svc-0", "coordinator-svc-1"):
        # The coordinators' log is a topic on partition_svc; their producer ids come from producer_id_svc.
        assert set(services[name]["depends_on"]) >= {"zookeeper", "producer-id-svc", "partition-svc-0", "partition-svc-1",
                                                      "partition-svc-2"}
    assert set(services["windowed-counts"]["depends_on"]) >= {"coordinator-svc-0", "coordinator-svc-1", "partition-svc-0"}

    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"dependency cycle {path + (name,)}"
        for dependency in services[name].get("depends_on", {}):
            visit(dependency, path + (name,))
        if name not in order:
            order.append(name)

    for name in services:
        visit(name, ())
    assert order.index("zookeeper") == 0


def test_published_ports_are_loopback_only_and_distinct(services):
    published = {}
    for name in EXPECTED:
        [mapping] = services[name]["ports"]
        host, host_port, container_port = mapping.split(":")
        assert host == "127.0.0.1", name
        assert int(container_port) == KINDS[EXPECTED[name]]
        published[name] = int(host_port)
    assert len(set(published.values())) == len(published)
    assert "ports" not in services["zookeeper"]


def test_stop_grace_exceeds_the_services_shutdown_grace(services):
    for name in EXPECTED:
        grace_s = float(services[name]["environment"]["TXLOG_SHUTDOWN_GRACE_S"])
        assert seconds(services[name]["stop_grace_period"]) > grace_s


def test_services_run_read_only_without_capabilities(services):
    for name in EXPECTED:
        service = services[name]
        assert service["read_only"] is True
        assert service["tmpfs"] == ["/tmp"]
        assert service["cap_drop"] == ["ALL"]
        assert service["build"] == {"context": ".", "target": "service"}
        assert service["image"] == "txlog:dev"


def test_spark_job_is_a_one_shot_service_of_the_java_image_against_every_partition_svc(services):
    job = services["windowed-counts"]
    assert job["build"] == {"context": ".", "target": "spark"}
    assert job["profiles"] == ["jobs"]
    assert job["restart"] == "no"
    assert job["command"] == ["python", "-m", "spark_jobs.windowed_counts", "--once"]
    env = job["environment"]
    partitions = [services[n]["environment"]["TXLOG_ADVERTISED_ADDRESS"] for n, k in EXPECTED.items() if k == "partition_svc"]
    assert env["TXLOG_BOOTSTRAP"].split(",") == partitions
    assert env["TXLOG_SPARK_MASTER"] == "local[2]"
    assert {"TXLOG_INPUT_TOPIC", "TXLOG_OUTPUT_TOPIC", "TXLOG_GROUP"} <= set(env)


# --- Dockerfile and .dockerignore ------------------------------------------------------------------


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """{stage: [(INSTRUCTION, arguments)]}, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+) AS (\S+)", arguments.strip(), re.IGNORECASE)
            assert match, f"every stage is named: {line}"
            current = match.group(2)
            stages[current] = [("FROM", match.group(1))]
        elif current is not None:
            stages[current].append((instruction, " ".join(arguments.split())))
    return stages


def test_dockerfile_is_multi_stage_on_slim_python_311_with_java_only_in_the_spark_stage():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    stages = dockerfile_stages()
    assert list(stages) == ["deps", "spark-deps", "builder", "spark-builder", "base", "spark", "service"]  # `service` last: the default
    assert stages["deps"][0] == ("FROM", "${PYTHON_IMAGE}") and stages["spark-deps"][0] == ("FROM", "deps")
    # the code comes after the dependencies, so a code change reinstalls none of them
    assert stages["builder"][0] == ("FROM", "deps") and stages["spark-builder"][0] == ("FROM", "spark-deps")
    assert stages["base"][0] == ("FROM", "${PYTHON_IMAGE}")  # the runtime does not carry the build stage
    assert stages["spark"][0] == ("FROM", "base") and stages["service"][0] == ("FROM", "base")
    assert any(i == "COPY" and a.startswith("--from=builder /opt/venv") for i, a in stages["base"])
    assert any(i == "COPY" and a.startswith("--from=spark-builder /opt/venv") for i, a in stages["spark"])
    assert any(i == "RUN" and "openjdk-17-jre-headless" in a for i, a in stages["spark"])
    assert not any("openjdk" in a for stage in ("deps", "builder", "base", "service") for _, a in stages[stage])


def requirements(extras: list[str]) -> list[str]:
    """What docker/requirements.py prints for these extras, run as the Dockerfile runs it."""
    done = subprocess.run([sys.executable, str(REPO / "docker" / "requirements.py"), *extras],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def test_the_service_image_installs_the_service_and_console_extras_and_only_the_spark_image_pyspark():
    stages = dockerfile_stages()
    installs = {stage: " ".join(a for i, a in steps if i == "RUN" and "requirements.py" in a)
                for stage, steps in stages.items()}
    assert "requirements.py service console " in installs["deps"] and "spark" not in installs["deps"]
    assert "requirements.py spark " in installs["spark-deps"]
    service = requirements(["service", "console"])
    names = {re.split(r"[<>=\[ ]", r)[0] for r in service}
    assert {"grpcio", "kazoo", "rocksdict", "protobuf"} <= names
    # the chart runs `txlog console` from the service image: its web server, framework, templates and forms
    assert {"starlette", "uvicorn", "jinja2", "python-multipart"} <= names
    assert not names & {"pyspark", "pandas", "pyarrow", "grpcio-tools", "pytest"}, names
    assert {"pyspark", "pandas", "pyarrow"} <= {re.split(r"[<>=\[ ]", r)[0] for r in requirements(["spark"])}
    dev = requirements(["dev"])  # what the README's commands install: everything
    assert set(service) | set(requirements(["spark"])) <= set(dev) and not any(r.startswith("txlog") for r in dev)
    # the build imports the console too, so an image without its dependencies fails to build
    [check] = [a for i, a in stages["builder"] if i == "RUN" and "python -c" in a]
    assert "txlog.console.app" in check and "partition_svc.server" in check


def test_runnable_stages_run_as_a_non_root_user_with_a_health_check():
    stages = dockerfile_stages()
    for stage in ("spark", "service"):
        users = [a for i, a in stages[stage] if i == "USER"]
        assert users and users[-1].split(":")[0] not in ("root", "0"), stage
    [healthcheck] = [a for i, a in stages["service"] if i == "HEALTHCHECK"]
    assert healthcheck.endswith('CMD ["python", "/opt/txlog/healthcheck.py"]')
    assert ("HEALTHCHECK", "NONE") in stages["spark"]
    assert any(i == "COPY" and a == "docker/healthcheck.py /opt/txlog/healthcheck.py" for i, a in stages["base"])


def test_the_image_copies_every_package_the_distribution_installs():
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    top_level = {p.rstrip("*") for p in packages}
    stages = dockerfile_stages()
    copied = {a.split()[0] for stage in ("deps", "builder") for i, a in stages[stage] if i == "COPY"}
    assert top_level <= copied, top_level - copied
    assert {"pyproject.toml", "README.md"} <= copied  # pyproject names README.md as the readme


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent
    folders decides; `!` re-includes (`*` does not cross `/`, `**` does)."""
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            excluded = not negated
    return excluded


def test_dockerignore_keeps_the_build_context_to_what_the_image_needs():
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    for path in ("pyproject.toml", "README.md", "docker/healthcheck.py", "docker/requirements.py", "txlog/producer.py",
                 "txlog/v1/partition_pb2.py", "partition_svc/server.py", "coordinator_svc/server.py",
                 "producer_id_svc/server.py", "spark_jobs/windowed_counts.py"):
        assert not dockerignored(path, patterns), f"{path} is needed by the image"
    for path in (".venv/bin/python", ".git/HEAD", ".cluster/cluster.json", "tests/conftest.py", "helm/txlog/Chart.yaml",
                 "services/__pycache__/cli.cpython-311.pyc", "bench/produce_fetch.py", "txlog.egg-info/PKG-INFO"):
        assert dockerignored(path, patterns), f"{path} should stay out of the build context"
    # every COPY source of the Dockerfile is in the context
    for instruction, arguments in dockerfile_stages()["builder"] + dockerfile_stages()["base"]:
        if instruction == "COPY" and not arguments.startswith("--from"):
            source = arguments.split()[0]
            assert not dockerignored(source, patterns), source


# --- the end-to-end transaction, without Docker --------------------------------------------------------


def test_the_end_to_end_transaction_script_commits_one_and_hides_the_aborted_one(txn_cluster):
    """test_compose_e2e.py runs this script inside the compose network; here it
    runs against the same services started locally, so it is known to work."""
    result = subprocess.run([sys.executable, str(ONE_TRANSACTION), txn_cluster.state.bootstrap, "deploy-local"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["values"] == ["committed-0", "committed-1"]
    # The aborted record lies below the end the consumer read to: it was skipped, not missed.
    assert outcome["position"] == outcome["last_stable_offset"] == outcome["high_watermark"] > 3


# --- the TLS variant (docker-compose.tls.yml) ----------------------------------------------------------

TLS_COMPOSE_FILE = REPO / "docker-compose.tls.yml"


def merged(base: dict, overlay: dict) -> dict:
    """Compose's merge of a second -f file: mappings merge key by key, sequences append."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = merged(base[key], value)
        elif isinstance(value, list) and isinstance(base.get(key), list):
            out[key] = base[key] + value
        else:
            out[key] = value
    return out


def tls_services(compose: dict) -> dict:
    return merged(compose, yaml.safe_load(TLS_COMPOSE_FILE.read_text()))["services"]


def compose_script(text: str, replacements: dict[str, str]) -> str:
    """A script in the compose file as the container's sh gets it ($$ is Compose's escaped $)."""
    text = text.replace("$$", "$")
    for old, new in replacements.items():
        text = text.replace(old, new)
    return text


def interpolated(value: str, shell: dict[str, str]) -> str:
    """Compose's ${VAR:-default}, VAR from the shell."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: shell.get(m.group(1), m.group(2)), value)


def run_certs_service(certs: dict, directory: Path) -> subprocess.CompletedProcess:
    """The `certs` service here: its entrypoint script around its command, with the volume at ``directory``."""
    entrypoint, command = certs["entrypoint"], certs["command"]
    assert entrypoint[:2] == ["sh", "-ec"] and command[:3] == ["python", "-m", "services.security.certs"]
    script = compose_script(entrypoint[2], {"/etc/txlog/tls": str(directory)})
    argv = [sys.executable, *command[1:]]
    argv[argv.index("--dir") + 1] = str(directory)
    return subprocess.run(["sh", "-ec", script, *entrypoint[3:], *argv], capture_output=True, text=True, timeout=120)


def test_the_tls_variant_gives_every_service_its_own_certificate_from_a_ca_made_first(compose, tmp_path):
    services = tls_services(compose)
    certs_command = services["certs"]["command"]
    assert certs_command[:3] == ["python", "-m", "services.security.certs"]
    servers = certs_command[certs_command.index("--servers") + 1].split(",")
    clients = certs_command[certs_command.index("--clients") + 1].split(",")
    assert sorted(servers) == sorted(EXPECTED)  # one per txlog service, named as it advertises itself
    # the certs service, run here, makes exactly the files the services are given
    done = run_certs_service(services["certs"], tmp_path)
    assert done.returncode == 0, done.stderr
    for name in (*EXPECTED, "windowed-counts"):
        service = services[name]
        env = service["environment"]
        assert service["depends_on"]["certs"] == {"condition": "service_completed_successfully"}
        assert "tls:/etc/txlog/tls:ro" in service["volumes"]
        for variable in ("TXLOG_TLS_CA", "TXLOG_TLS_CERT", "TXLOG_TLS_KEY"):
            assert env[variable].startswith("/etc/txlog/tls/"), (name, variable)
            assert (tmp_path / env[variable].rsplit("/", 1)[1]).exists(), (name, env[variable])
        owner = name if name in EXPECTED else "spark-job"
        assert env["TXLOG_TLS_CERT"] == f"/etc/txlog/tls/{owner}.pem"
        if name in EXPECTED:
            assert env["TXLOG_ADVERTISED_ADDRESS"].split(":")[0] == name  # the name its certificate holds
            assert env["TXLOG_HEALTH_LISTEN"] == "0.0.0.0:7900"  # what the image's health check asks with TLS on
            assert set(env) <= settings_read_by(kind_of(service)), name
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"),
                             *(str(tmp_path / f"{n}.pem") for n in (*servers, *clients))], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr


def certificate_principal(cert: Path) -> str:
    """User:<CN>: the principal the default mapping rule makes of a certificate."""
    from txlog.net import tls

    subject = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-subject", "-nameopt", "RFC2253"],
                             capture_output=True, text=True, check=True).stdout.strip().removeprefix("subject=")
    return tls.principal_of_subject(subject, tls.parse_mapping_rules(tls.DEFAULT_PRINCIPAL_MAPPING_RULES))


def test_the_tls_variant_runs_the_acl_authorizer_with_the_services_and_admin_as_super_users(compose, tmp_path):
    from services.security import authorizer

    services = tls_services(compose)
    done = run_certs_service(services["certs"], tmp_path)
    assert done.returncode == 0, done.stderr
    certificates = {name: tmp_path / services[name]["environment"]["TXLOG_TLS_CERT"].rsplit("/", 1)[1] for name in EXPECTED}
    service_principals = {certificate_principal(cert) for cert in certificates.values()}
    assert service_principals == {f"User:{name}" for name in EXPECTED}
    admin = certificate_principal(tmp_path / "admin.pem")
    assert admin == "User:admin"
    for name in EXPECTED:
        env = services[name]["environment"]
        assert env["TXLOG_AUTHORIZER"] == "acl", name
        # every service's own principal (they call one another: ClusterAction) and the admin's
        assert authorizer.parse_super_users(env["TXLOG_SUPER_USERS"]) == service_principals | {admin}, name
    # the job is a client, not a super user: it gets ACLs (spark-job-acls)
    job = services["windowed-counts"]
    assert certificate_principal(tmp_path / "spark-job.pem") not in service_principals | {admin}
    assert "TXLOG_SUPER_USERS" not in job["environment"]
    assert job["depends_on"]["spark-job-acls"] == {"condition": "service_completed_successfully"}


def test_the_tls_variant_gives_the_services_a_zookeeper_identity_made_once(compose, tmp_path):
    from services.coordination import zk

    services = tls_services(compose)
    for name in EXPECTED:
        assert services[name]["environment"]["TXLOG_ZOOKEEPER_AUTH_FILE"] == "/etc/txlog/tls/zookeeper-identity"
    assert run_certs_service(services["certs"], tmp_path).returncode == 0
    identity_file = tmp_path / "zookeeper-identity"
    identity = zk.digest_identity(str(identity_file))
    user, _, password = identity.partition(":")
    assert user == "txlog" and len(password) >= 32
    assert identity_file.stat().st_mode & 0o077 == 0  # the owner's only (the services run as the same user)
    # a second `up` keeps it: the znodes' ACLs name it
    assert run_certs_service(services["certs"], tmp_path).returncode == 0
    assert zk.digest_identity(str(identity_file)) == identity
    assert not (tmp_path / "zookeeper-identity.new").exists()


def test_the_spark_job_acls_service_grants_the_job_what_the_chart_grants_it(compose, tmp_path):
    """spark-job-acls's script, run here by sh against a local cluster with TLS
    and the authorizer (whose tls/ folder has the layout of the `tls` volume),
    adds the bindings the Helm chart's hook Job adds for the same job."""
    from chart_render import acl_bindings, render

    from services.security import certs
    from services.tooling.cluster import LocalCluster
    from txlog import Admin

    services = tls_services(compose)
    acls = services["spark-job-acls"]
    assert acls["profiles"] == services["windowed-counts"]["profiles"] == ["jobs"]  # `run windowed-counts` starts it
    assert acls["restart"] == "no" and acls["healthcheck"] == {"disable": True}
    assert acls["depends_on"]["certs"] == {"condition": "service_completed_successfully"}
    assert {n for n, c in acls["depends_on"].items() if c == {"condition": "service_healthy"}} == \
        {n for n, k in EXPECTED.items() if k == "partition_svc"}
    assert "tls:/etc/txlog/tls:ro" in acls["volumes"]
    # the job's settings, as Compose fills them in from the shell (here: two input topics)
    job_env = services["windowed-counts"]["environment"]
    shell = {"TXLOG_INPUT_TOPIC": "page-views,clicks"}
    env = {key: interpolated(value, shell) for key, value in acls["environment"].items()}
    assert env == {"INPUT_TOPIC": "page-views,clicks", "OUTPUT_TOPIC": "event-counts", "GROUP": "windowed-counts"}
    assert [acls["environment"][k] for k in ("INPUT_TOPIC", "OUTPUT_TOPIC", "GROUP")] == \
        [job_env[k] for k in ("TXLOG_INPUT_TOPIC", "TXLOG_OUTPUT_TOPIC", "TXLOG_GROUP")]
    assert acls["command"][:2] == ["sh", "-ec"]

    local = LocalCluster(tmp_path / "cluster")
    local.up(producer_id_svcs=0, partition_svcs=1, coordinator_svcs=0, tls=True)
    try:
        # the job's certificate, as `certs` issues it (--clients spark-job): whose principal the script must grant
        job_cert = job_env["TXLOG_TLS_CERT"].rsplit("/", 1)[1]
        certs.issue(Path(local.state.tls["dir"]), job_cert.removesuffix(".pem"))
        job_principal = certificate_principal(Path(local.state.tls["dir"]) / job_cert)
        bootstrap = job_env["TXLOG_BOOTSTRAP"]
        script = compose_script(acls["command"][2], {"/etc/txlog/tls": local.state.tls["dir"], bootstrap: local.state.bootstrap})
        assert bootstrap not in script
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `txlog`, as in the image's PATH
        done = subprocess.run(["sh", "-ec", script], env={**os.environ, **env, "PATH": path, "HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        with Admin(local.state.bootstrap, **local.client_tls()) as admin:
            found = sorted((b.permission, b.principal, b.operation, b.resource_type, b.pattern_type, b.resource_name, b.host)
                           for b in admin.describe_acls())
    finally:
        local.down(grace_s=5)
    chart = render({"sparkJob": {"inputTopic": env["INPUT_TOPIC"], "outputTopic": env["OUTPUT_TOPIC"], "group": env["GROUP"]},
                    "authorizer": {"sparkJobPrincipal": job_principal}})
    assert found == sorted(acl_bindings(chart.get("Job", "txlog-acls")))
    assert len(found) == 6
