"""The Helm chart's workloads run for real under podman (chart_smoke.py, which
`make chart-smoke` runs too): every rendered StatefulSet, Deployment, Job and
the CronJob's job started from the built images with exactly the rendered
command, environment, mounts and security settings; every probe passing as
the kubelet runs it; the ACL hook Job and the Spark job succeeding; and the
exactly-once chaos workload with no anomaly while one pod of each workload is
killed and replaced."""

from __future__ import annotations

import chart_smoke
import pytest

from services.tooling.chaos.checker import ANOMALIES

SECONDS = 30.0


@pytest.mark.timeout(3600)  # the first build on a machine makes the base and installs every wheel into the images
def test_the_charts_workloads_start_pass_their_probes_run_their_jobs_and_lose_nothing_when_pods_are_killed():
    rendered = chart_smoke.render(chart_smoke.image_values())
    found = chart_smoke.workloads(rendered)
    services = found["StatefulSet"] + found["Deployment"]
    pods = sum(w["spec"].get("replicas", 1) for w in services)
    summary = chart_smoke.smoke(seconds=SECONDS, seed=11)
    assert summary["workloads_started"] == len(services) + len(found["hooks"]) + len(found["Job"]) + len(found["CronJob"]), summary
    assert summary["probes_failed"] == 0, summary["failed_probes"]
    # every pod (each replacement too) passed each of its probes, and every service pod its liveness probe at the end
    component = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] for w in services}
    replaced = {name: summary["faults"].get(f"kill_{c}", 0) for name, c in component.items()}
    expected = sum(sum(f"{k}Probe" in chart_smoke.container(w) for k in ("startup", "readiness", "liveness"))
                   * (w["spec"].get("replicas", 1) + replaced[w["metadata"]["name"]])
                   + w["spec"].get("replicas", 1) * ("livenessProbe" in chart_smoke.container(w)) for w in services)
    assert summary["probes_passed"] == expected, summary
    assert summary["pods_started"] >= pods + sum(replaced.values()) + summary["jobs_succeeded"], summary
    assert summary["jobs_succeeded"] == len(found["hooks"]) + len(found["Job"]) + len(found["CronJob"]), summary
    job = summary["spark_job"]
    assert job["ranges"] == 4 and job["records_in"] == chart_smoke.EVENTS and job["records_out"] > 0, job
    assert {kind: summary[kind] for kind in ANOMALIES if summary[kind]} == {}, summary
    assert summary["anomalies"] == 0 and summary["stuck_workers"] == [], summary
    assert summary["committed"] > 0 and summary["final_read_committed"] > 0, summary
    # one pod of each StatefulSet and the Deployment's pod killed and replaced at least once
    assert set(summary["faults"]) == {f"kill_{c}" for c in component.values()}, summary["faults"]
