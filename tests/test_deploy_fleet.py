"""Static checks on the vLLM fleet's deployment files: the compose `fleet` profile, the Kubernetes manifests (vLLM
workers, vllm-router with service discovery, Lethe's replicas, PostgreSQL), the Prometheus jobs, and the commands of
docs/deployment.md. Every `LETHE_*` variable they name is a setting; ports, selectors and URLs agree with each
other; every vllm-router flag they use is one the installed router knows. Nothing here needs Docker or a cluster."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from app.settings import Settings
from bench.fleet import HEALTH_FLAGS, ROUTER

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
K8S = ROOT / "deploy" / "k8s"
DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"
ROUTER_DOCKERFILE = ROOT / "deploy" / "router" / "Dockerfile"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "lethe.json"
SETTINGS = {f"LETHE_{name.upper()}" for name in Settings.model_fields}
LETHE_VAR_RE = re.compile(r"\bLETHE_[A-Z0-9_]+")
FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
ROUTER_FLAG_LINE_RE = re.compile(r"vllm-router\b.*")


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _yaml(COMPOSE)["services"]
    return services


def _flag_values(args: list[str], flag: str) -> list[str]:
    """The values after `flag` in an argument list, up to the next flag."""
    if flag not in args:
        return []
    values = []
    for arg in args[args.index(flag) + 1 :]:
        if arg.startswith("--"):
            break
        values.append(arg)
    return values


def _flag(args: list[str], flag: str) -> str:
    (value,) = _flag_values(args, flag)
    return value


def _k8s_docs() -> list[dict[str, Any]]:
    return [doc for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def _named(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in _k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p.get("name", str(p["containerPort"])): int(p["containerPort"]) for p in container.get("ports", [])}


def _fleet_section() -> str:
    text = DEPLOYMENT_DOC.read_text(encoding="utf-8")
    start = text.index("## A vLLM fleet")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


# --- every LETHE_* variable is a setting ---------------------------------------------------------------------


def test_every_lethe_variable_the_fleet_files_name_is_a_setting() -> None:
    named: dict[str, set[str]] = {}
    for path in (COMPOSE, *sorted(K8S.glob("*.yaml"))):
        named[path.name] = set(LETHE_VAR_RE.findall(path.read_text(encoding="utf-8")))
    named["docs/deployment.md fleet section"] = set(LETHE_VAR_RE.findall(_fleet_section()))
    assert named["docs/deployment.md fleet section"] >= {"LETHE_ENGINE", "LETHE_VLLM_URL"}
    for where, names in named.items():
        assert names <= SETTINGS, f"{where} names unknown settings {sorted(names - SETTINGS)}"


# --- docker compose: the fleet profile -----------------------------------------------------------------------


def test_compose_fleet_profile_routes_to_its_workers_with_fast_failover() -> None:
    services = _services()
    workers = [name for name in services if name.startswith("vllm-worker-")]
    assert len(workers) >= 2
    for name in [*workers, "vllm-router"]:
        assert services[name]["profiles"] == ["fleet"], name
    for name in workers:
        args = services[name]["command"]
        assert "--enable-prefix-caching" in args and "--enable-prompt-tokens-details" in args
        assert _flag(args, "--scheduling-policy") == "priority"  # a forget's replay first (LETHE_VLLM_REMOTE_PRIORITY)
    router = services["vllm-router"]["command"]
    assert _flag(router, "--policy") == "consistent_hash"
    for url in _flag_values(router, "--worker-urls"):
        parsed = urlparse(url)
        assert parsed.hostname in workers, url
        assert str(parsed.port) == _flag(services[str(parsed.hostname)]["command"], "--port")
    assert {urlparse(u).hostname for u in _flag_values(router, "--worker-urls")} == set(workers)
    assert int(_flag(router, "--health-check-interval-secs")) * int(_flag(router, "--health-failure-threshold")) <= 5
    assert set(services["vllm-router"]["depends_on"]) == set(workers)
    assert services["lethe"]["depends_on"]["vllm-router"]["required"] is False
    # The URL the compose file and docs/deployment.md give Lethe for the fleet is the router's.
    port = _flag(router, "--port")
    assert f"LETHE_VLLM_URL=http://vllm-router:{port}" in COMPOSE.read_text()
    assert [int(p.split(":")[-1]) for p in services["vllm-router"]["ports"]] == [int(port)]


def test_prometheus_scrapes_the_router_and_the_workers() -> None:
    services = _services()
    jobs = {job["job_name"]: job for job in _yaml(PROMETHEUS)["scrape_configs"]}
    (router_target,) = [t for s in jobs["vllm-router"]["static_configs"] for t in s["targets"]]
    host, port = router_target.rsplit(":", 1)
    assert host == "vllm-router" and port == _flag(services[host]["command"], "--prometheus-port")
    assert _flag(services[host]["command"], "--prometheus-host") == "0.0.0.0"
    workers = {t.rsplit(":", 1)[0]: t.rsplit(":", 1)[1] for s in jobs["vllm"]["static_configs"] for t in s["targets"]}
    for name, service in services.items():
        if name == "vllm" or name.startswith("vllm-worker-"):
            assert workers[name] == _flag(service["command"], "--port"), name


# --- Kubernetes ----------------------------------------------------------------------------------------------


def test_k8s_services_select_a_workload_and_target_its_ports() -> None:
    docs = _k8s_docs()
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    for workload in workloads:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items(), workload["metadata"]["name"]
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if "prometheus.io/port" in annotations:
            assert int(annotations["prometheus.io/port"]) in _ports(_container(workload)).values()
    services = [d for d in docs if d["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} >= {"lethe", "vllm-router", "postgres"}
    for service in services:
        selector = service["spec"]["selector"]
        (workload,) = [w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        ports = _ports(_container(workload))
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert (target in ports) if isinstance(target, str) else (target in ports.values()), (service, target)


def test_k8s_router_discovers_the_workers_it_may_list() -> None:
    worker, router = _named("Deployment", "vllm-worker"), _named("Deployment", "vllm-router")
    assert worker["spec"]["replicas"] >= 2
    args = _container(router)["args"]
    assert _flag(args, "--policy") == "consistent_hash" and "--service-discovery" in args
    selector = dict(item.split("=", 1) for item in _flag_values(args, "--selector"))
    assert selector and selector.items() <= worker["spec"]["template"]["metadata"]["labels"].items()
    assert int(_flag(args, "--service-discovery-port")) == _ports(_container(worker))["http"]
    namespace = _flag(args, "--service-discovery-namespace")
    env = {e["name"]: e for e in _container(router)["env"]}
    assert namespace == "$(POD_NAMESPACE)" and env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"]
    worker_args = _container(worker)["args"]
    assert "--enable-prefix-caching" in worker_args and "--enable-prompt-tokens-details" in worker_args
    assert _flag(worker_args, "--scheduling-policy") == "priority"
    assert int(_flag(worker_args, "--port")) == _ports(_container(worker))["http"]
    ports = _ports(_container(router))
    assert int(_flag(args, "--port")) == ports["http"] and int(_flag(args, "--prometheus-port")) == ports["metrics"]
    assert int(_flag(args, "--health-check-interval-secs")) * int(_flag(args, "--health-failure-threshold")) <= 5
    # Its service account may list and watch pods, through a role bound to it.
    account = router["spec"]["template"]["spec"]["serviceAccountName"]
    _named("ServiceAccount", account)
    binding = _named("RoleBinding", account)
    assert {"kind": "ServiceAccount", "name": account} in binding["subjects"]
    role = _named("Role", binding["roleRef"]["name"])
    assert any("pods" in r["resources"] and {"list", "watch"} <= set(r["verbs"]) for r in role["rules"])


def test_k8s_lethe_replicas_point_at_the_router_and_the_database() -> None:
    lethe = _named("Deployment", "lethe")
    assert lethe["spec"]["replicas"] >= 2
    text = (K8S / "lethe.yaml").read_text()
    literals = dict(re.findall(r"--from-literal=(LETHE_[A-Z_]+)='?([^' \\]+)'?", text))
    assert literals["LETHE_ENGINE"] == "vllm-remote"
    vllm = urlparse(literals["LETHE_VLLM_URL"])
    router = _named("Service", str(vllm.hostname))
    assert vllm.port in [p["port"] for p in router["spec"]["ports"] if p["name"] == "http"]
    database = urlparse(literals["LETHE_DATABASE_URL"])
    postgres = _named("Service", str(database.hostname))
    assert database.port in [p["port"] for p in postgres["spec"]["ports"]]
    container = _container(_named("StatefulSet", str(database.hostname)))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert database.username == env["POSTGRES_USER"] and database.path == f"/{env['POSTGRES_DB']}"


# --- the router's flags exist --------------------------------------------------------------------------------


def _router_flags_used() -> dict[str, set[str]]:
    services = _services()
    used = {
        "compose": set(FLAG_RE.findall(" ".join(services["vllm-router"]["command"]))),
        "k8s": set(FLAG_RE.findall(" ".join(_container(_named("Deployment", "vllm-router"))["args"]))),
        "bench/fleet.py": set(FLAG_RE.findall(" ".join(HEALTH_FLAGS))),
        "docs/deployment.md": set(),
    }
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", _fleet_section(), re.S):
        command = block.replace("\\\n", " ")
        for line in command.splitlines():
            found = ROUTER_FLAG_LINE_RE.search(line)
            if found:
                used["docs/deployment.md"] |= set(FLAG_RE.findall(found.group(0)))
    assert used["docs/deployment.md"], "docs/deployment.md's fleet section starts no vllm-router"
    return used


def test_every_router_flag_the_files_use_is_a_flag_of_the_installed_router() -> None:
    router = shutil.which(str(ROUTER)) or shutil.which("vllm-router")
    if router is None:
        pytest.skip("vllm-router is not installed: `make install-fleet` (or `make test`) adds it")
    help_text = subprocess.run([router, "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    known = set(FLAG_RE.findall(help_text))
    for where, flags in _router_flags_used().items():
        assert flags <= known, f"{where} uses flags vllm-router does not have: {sorted(flags - known)}"
    assert "vllm-router==" in ROUTER_DOCKERFILE.read_text()
    pinned = re.search(r'"vllm-router==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned and f"vllm-router=={pinned.group(1)}" in ROUTER_DOCKERFILE.read_text()


def test_the_dashboards_router_metrics_are_metrics_of_the_installed_router() -> None:
    """The router registers a metric when it first records it, so a live router shows only those it has used; its
    library holds every name. (The workers' `vllm:` names are checked against live workers in tests/fleet.)"""
    spec = importlib.util.find_spec("vllm_router_rs")
    if spec is None or spec.origin is None:
        pytest.skip("vllm-router is not installed: `make install-fleet` (or `make test`) adds it")
    library = Path(spec.origin).read_bytes()
    names = set(re.findall(r"vllm_router_[a-z_]+", DASHBOARD.read_text()))
    assert names, "the dashboard plots no router metric"
    for name in names:
        assert name.encode() in library, name
