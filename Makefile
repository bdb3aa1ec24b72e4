# txlog's commands. `make run` and `make test` set everything up first.
.PHONY: setup run test protos lint bench wheels image deploy-smoke chart-smoke

setup:
	scripts/setup.sh

run: setup
	scripts/main-job.sh

test:
	scripts/test.sh

# localhost/txlog:dev and localhost/txlog-spark:dev (and the compose stack's ZooKeeper) with podman
image: setup
	scripts/image.sh

# docker-compose.yml under podman: ready, the Spark job, the chaos workload under container faults; last line JSON
deploy-smoke: setup
	.venv/bin/python tests/deploy/compose_smoke.py

# the Helm chart's rendered workloads under podman: probes, the ACL and Spark jobs, the chaos workload under pod kills; last line JSON
chart-smoke: setup
	.venv/bin/python tests/deploy/chart_smoke.py

protos: setup
	.venv/bin/python -m services.tooling.protogen

lint: setup
	.venv/bin/ruff check .

# The release wheels in dist/: txlog (the client only) and txlog-service (scripts/build_wheels.py says why two)
wheels: setup
	.venv/bin/python scripts/build_wheels.py --out dist

bench: setup
	.venv/bin/python -m bench.producer_ids
	.venv/bin/python -m bench.produce_fetch
	.venv/bin/python -m bench.log_store_compaction
	.venv/bin/python -m bench.compression
	.venv/bin/python -m bench.transactions
	.venv/bin/python -m bench.prepare
	.venv/bin/python -m bench.spark_eos
	.venv/bin/python -m bench.replication
	.venv/bin/python -m bench.metrics
	.venv/bin/python -m bench.scale
	.venv/bin/python -m bench.check_back
