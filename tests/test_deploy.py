"""The Kubernetes manifest Chapter 9 shows parses, and asks for what an inference server needs:
probes on /health, a grace period for draining, and autoscaling on queue depth."""

import yaml

from inferlab.serve.__main__ import main as serve_main  # noqa: F401  (the command it runs)


def test_manifest(root):
    docs = {d["kind"]: d for d in yaml.safe_load_all((root / "deploy" / "kubernetes.yaml").read_text())}
    assert set(docs) == {"Deployment", "Service", "HorizontalPodAutoscaler"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "inferlab.serve"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert pod["terminationGracePeriodSeconds"] >= 30  # the server drains for up to 30 s
    [metric] = docs["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "inferlab_requests_waiting"
    scrape = docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert scrape["prometheus.io/path"] == "/metrics"


def test_metric_names_exist(root):
    from inferlab.serving import metrics
    text = (root / "inferlab" / "serving" / "metrics.py").read_text()
    assert '"inferlab_requests_waiting"' in text and metrics.ServerMetrics
