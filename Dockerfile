# syntax=docker/dockerfile:1
# One image for every txlog service (the command picks which), and a second
# target with Java and PySpark for the Spark jobs:
#
#   docker build -t txlog:dev .                        # target `service` (the last stage)
#   docker build -t txlog-spark:dev --target spark .
#   docker run --rm txlog:dev python -m partition_svc --zookeeper zk:2181
#
# Stages: `deps` installs the `service` and `console` extras' dependencies
# into a virtualenv (no PySpark, pandas or pyarrow: about 800 MB less; the
# console's web server and templates, a few MB, so the chart can run
# `txlog console` from this image), `spark-deps` adds the
# `spark` extra's to a copy of it; `builder` and `spark-builder` install the
# package itself into each; `base` is the slim runtime with the
# service virtualenv and a non-root user; `spark` swaps in the Spark virtualenv
# and adds a JRE; `service` adds the gRPC health check.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# The dependencies get layers of their own, keyed on pyproject.toml alone, so
# a code change rebuilds in seconds (and reinstalls no Spark wheels).
COPY pyproject.toml ./
COPY docker/requirements.py ./docker/requirements.py
# Behind a TLS-inspecting proxy, pass its CA bundle as the build secret
# `ca-bundle` (`make image` does: --secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt);
# a secret is mounted for this step only and lands in no layer.
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python docker/requirements.py service console > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "setuptools>=68" wheel

FROM deps AS spark-deps
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python docker/requirements.py spark > /tmp/requirements-spark.txt \
    && pip install -r /tmp/requirements-spark.txt

# The code, into each virtualenv; the build tools came with the dependencies:
# these layers need no network.
FROM deps AS builder
COPY README.md ./
COPY txlog ./txlog
COPY services ./services
COPY producer_id_svc ./producer_id_svc
COPY partition_svc ./partition_svc
COPY coordinator_svc ./coordinator_svc
COPY spark_jobs ./spark_jobs
RUN pip install --no-deps --no-build-isolation . \
    && python -c "import txlog, txlog.console.app, producer_id_svc.server, partition_svc.server, coordinator_svc.server"

FROM spark-deps AS spark-builder
COPY --from=builder /src /src
RUN pip install --no-deps --no-build-isolation . \
    && python -c "import pyspark, spark_jobs.eos"

FROM ${PYTHON_IMAGE} AS base
# Bytecode was compiled at install time; the root filesystem may be read-only.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    TXLOG_DATA_DIR=/var/lib/txlog/data
RUN groupadd --system --gid 10001 txlog \
    && useradd --system --uid 10001 --gid txlog --home-dir /home/txlog --create-home --shell /usr/sbin/nologin txlog \
    && mkdir -p /var/lib/txlog/data /etc/txlog/tls \
    && chown -R txlog:txlog /var/lib/txlog /etc/txlog/tls
COPY --from=builder /opt/venv /opt/venv
COPY docker/healthcheck.py /opt/txlog/healthcheck.py
# /etc/txlog/tls: where certificates are mounted (a new named volume there
# copies this owner, so the compose file's `certs` service can write them).
# partition_svc's RocksDB lives under here: mount a volume on it (a new named
# volume copies this folder's owner, so the non-root user can write to it).
# No VOLUME line: the stateless services would each get an anonymous volume.
WORKDIR /var/lib/txlog

FROM base AS spark
COPY --from=spark-builder /opt/venv /opt/venv
# Debian's slim images ship without man folders, and the JRE's postinst fails
# on the missing symlink target without this one.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
ENV HOME=/home/txlog
USER 10001:10001
# A batch job: nothing to ask for health.
HEALTHCHECK NONE
CMD ["python", "-m", "spark_jobs.windowed_counts", "--help"]

FROM base AS service
USER 10001:10001
# producer_id_svc, coordinator_svc, partition_svc (their default listen ports)
EXPOSE 7100 7200 7300
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/txlog/healthcheck.py"]
# No default service: say which one, e.g. `python -m partition_svc`.
CMD ["python", "-m", "partition_svc", "--help"]
