"""ops/: the Kubernetes/KEDA manifests, the Grafana dashboard and the runbook.

`kubectl kustomize` builds the base and every zone's overlay (skipped, by name, where
kubectl is absent); the built resources are checked against the code: container commands
are parsed by the real `haco` CLI, each zone's ScaledObject watches that zone's Celery
queue in the broker's database, settings are HacoSettings fields, and every metric the
dashboard queries is one that coordinator/api/metrics.py exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from test_compose import SIM_POOL, haco_lines, parse_haco

from coordinator.api.metrics import ApiMetrics
from coordinator.config import HacoSettings
from coordinator.runtime.pool import load_pool
from coordinator.state.keys import BROKER_DB, queue_for

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "ops" / "k8s"
BASE = K8S / "base"
RUNBOOK = ROOT / "ops" / "RUNBOOK.md"
DASHBOARD = ROOT / "ops" / "grafana" / "haco-dashboard.json"
SETTINGS = {f"HACO_{name.upper()}" for name in HacoSettings.model_fields}
ZONES = load_pool(SIM_POOL).zones
GRACE_MARGIN_S = 15
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is absent: no build")
WORKER_LABELS = {"app.kubernetes.io/name": "haco", "app.kubernetes.io/component": "worker"}


def build(path: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    run = subprocess.run(
        [KUBECTL, "kustomize", str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    found: list[dict[str, Any]] = [*spec.get("initContainers", []), *spec["containers"]]
    return found


def haco_args(container: dict[str, Any]) -> list[str]:
    """The `haco` arguments of a container of the HACO image (entrypoint `haco`)."""
    command = container.get("command", [])
    assert command in ([], ["haco"]), f"{container['name']}: command {command}"
    args: list[str] = container["args"]
    return args


def settings_env() -> dict[str, str]:
    lines = (BASE / "settings.env").read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def secret_templates() -> dict[str, dict[str, str]]:
    docs = yaml.safe_load_all((BASE / "secret.example.yaml").read_text(encoding="utf-8"))
    return {d["metadata"]["name"]: d["stringData"] for d in docs if d}


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return build(BASE)


@pytest.fixture(scope="module")
def overlays() -> dict[str, list[dict[str, Any]]]:
    return {zone: build(K8S / "overlays" / zone) for zone in ZONES}


@needs_kubectl
def test_every_resource_is_named_and_namespaced(
    base: list[dict[str, Any]], overlays: dict[str, list[dict[str, Any]]]
) -> None:
    for doc in [*base, *(d for docs in overlays.values() for d in docs)]:
        assert doc.get("apiVersion") and doc.get("kind"), doc
        assert doc["metadata"].get("name"), doc
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "haco", doc["metadata"]["name"]


@needs_kubectl
def test_containers_run_real_haco_subcommands_with_resources(
    base: list[dict[str, Any]], overlays: dict[str, list[dict[str, Any]]]
) -> None:
    commands: dict[str, str] = {}
    for doc in [*base, *(d for docs in overlays.values() for d in docs)]:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        for c in containers(doc):
            assert c["image"].startswith("haco"), c["image"]
            commands[doc["metadata"]["name"]] = parse_haco(haco_args(c))[0]
            res = c["resources"]
            assert set(res) == {"requests", "limits"}, doc["metadata"]["name"]
            assert {"cpu", "memory"} <= set(res["requests"]) & set(res["limits"])
    assert commands == {
        "haco-api": "serve",
        "haco-beat": "beat",
        "haco-harvester": "harvester",
        "haco-judge": "worker",
        "haco-migrate": "migrate",
        **{f"haco-worker-{z}": "worker" for z in ZONES},
    }


def test_overlays_are_the_pools_zones() -> None:
    assert sorted(p.name for p in (K8S / "overlays").iterdir()) == sorted(ZONES)
    assert (BASE / "pool.toml").read_bytes() == SIM_POOL.read_bytes()


@needs_kubectl
def test_each_zone_has_a_worker_and_a_scaledobject_on_its_queue(
    base: list[dict[str, Any]], overlays: dict[str, list[dict[str, Any]]]
) -> None:
    auths = by_kind(base, "TriggerAuthentication")
    secrets = secret_templates()
    for zone, docs in overlays.items():
        deployments = by_kind(docs, "Deployment")
        assert set(deployments) == {f"haco-worker-{zone}"}
        (dep,) = deployments.values()
        (container,) = containers(dep)
        _, params = parse_haco(haco_args(container))
        assert params["zone"] == zone and not params["judge"]
        assert "replicas" not in dep["spec"], "KEDA owns the replica count"
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"] == labels
        assert labels["haco.io/zone"] == zone
        (so,) = by_kind(docs, "ScaledObject").values()
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
        assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
        (trigger,) = so["spec"]["triggers"]
        assert trigger["type"] == "redis"
        meta = trigger["metadata"]
        assert meta["listName"] == queue_for(zone)
        assert meta["databaseIndex"] == str(BROKER_DB)  # Celery's lists live in the broker DB
        assert int(meta["listLength"]) >= 1
        auth = auths[trigger["authenticationRef"]["name"]]
        params_of = {t["parameter"]: t for t in auth["spec"]["secretTargetRef"]}
        assert "address" in params_of or "host" in params_of
        for ref in params_of.values():
            assert ref["key"] in secrets[ref["name"]], ref


@needs_kubectl
def test_the_pdb_selects_every_worker_and_nothing_else(
    base: list[dict[str, Any]], overlays: dict[str, list[dict[str, Any]]]
) -> None:
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in [*base, *(d for docs in overlays.values() for d in docs)]
        if d["kind"] == "Deployment"
    }
    pdbs = by_kind(base, "PodDisruptionBudget")
    for name, labels in pods.items():
        matching = [
            p
            for p, pdb in pdbs.items()
            if pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        is_worker = WORKER_LABELS.items() <= labels.items()
        # One PDB per pod at most: overlapping budgets make the eviction API refuse.
        assert matching == (["haco-workers"] if is_worker else ["haco-api"] * (name == "haco-api"))
    assert pdbs["haco-workers"]["spec"]["maxUnavailable"] == 1


@needs_kubectl
def test_grace_periods_cover_the_deadline(
    base: list[dict[str, Any]], overlays: dict[str, list[dict[str, Any]]]
) -> None:
    deadline = float(settings_env()["HACO_DEFAULT_DEADLINE_S"])
    pool_deadline = load_pool(SIM_POOL).defaults.deadline_s or 0.0
    running_members = [by_kind(docs, "Deployment") for docs in overlays.values()]
    deployments = by_kind(base, "Deployment")
    for dep in [deployments["haco-api"], deployments["haco-judge"]] + [
        d for found in running_members for d in found.values()
    ]:
        grace = pod_spec(dep)["terminationGracePeriodSeconds"]
        assert grace >= max(deadline, pool_deadline) + GRACE_MARGIN_S, dep["metadata"]["name"]


@needs_kubectl
def test_shared_services(base: list[dict[str, Any]]) -> None:
    deps = by_kind(base, "Deployment")
    beat = deps["haco-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    api = deps["haco-api"]
    (c,) = containers(api)
    assert c["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    _, serve = parse_haco(haco_args(c))
    assert serve["host"] == "0.0.0.0"
    assert c["ports"][0]["containerPort"] == serve["port"]
    svc = by_kind(base, "Service")["haco-api"]
    assert svc["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    job = by_kind(base, "Job")["haco-migrate"]
    assert parse_haco(haco_args(containers(job)[0]))[0] == "migrate"
    assert pod_spec(job)["restartPolicy"] in ("OnFailure", "Never")


@needs_kubectl
def test_config_and_secrets_are_settings_and_exist(
    base: list[dict[str, Any]],
    overlays: dict[str, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cms = by_kind(base, "ConfigMap")
    env = cms["haco-settings"]["data"]
    assert set(env) <= SETTINGS, set(env) - SETTINGS
    secrets = secret_templates()
    assert {k for s in secrets.values() for k in s if k.startswith("HACO_")} <= SETTINGS
    for key in SETTINGS:
        monkeypatch.delenv(key, raising=False)
    for key, value in [*env.items(), *secrets["haco-secrets"].items()]:
        monkeypatch.setenv(key, value)
    settings = HacoSettings()  # every value validates
    pool_mount = Path(str(settings.pool_file))
    assert tomllib.loads(cms["haco-pool"]["data"][pool_mount.name])["zones"] == ZONES
    for doc in [*base, *(d for docs in overlays.values() for d in docs)]:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        for c in containers(doc):
            for src in c["envFrom"]:
                if "configMapRef" in src:
                    assert src["configMapRef"]["name"] in cms
                else:
                    assert src["secretRef"]["name"] in secrets
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            assert mounts["pool"] == str(pool_mount.parent)
        volumes = {v["name"]: v for v in pod_spec(doc)["volumes"]}
        assert volumes["pool"]["configMap"]["name"] == "haco-pool"


def exported_metrics() -> set[str]:
    """The sample names `GET /metrics` exposes, scrape-time families included."""
    snapshot = SimpleNamespace(exhausted=0, spent_backups=0, request_tokens=1.0, llm_tokens=1.0)
    metrics = ApiMetrics(
        roles=("coder",),
        delays=SimpleNamespace(delay_s=lambda role: 1.0),
        budget=SimpleNamespace(snapshot=lambda: snapshot),
    )
    names: set[str] = set()
    for family in metrics.registry.collect():
        names |= {s.name for s in family.samples}
        if family.type == "histogram":  # labelled: no sample before the first observation
            names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    return names


def test_dashboard_queries_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    queried = {m for e in exprs for m in re.findall(r"\bhaco_[a-z0-9_]+\b", e)}
    exported = exported_metrics()
    assert queried <= exported, queried - exported
    wanted = {
        "haco_invocations_total", "haco_hedge_set_size_bucket", "haco_hedged_invocations_total",
        "haco_backups_total", "haco_backup_wins_total", "haco_budget_exhausted_total",
        "haco_all_failed_total", "haco_member_latency_seconds_bucket",
        "haco_loser_tokens_total", "haco_hedge_delay_seconds",
    }  # fmt: skip
    assert wanted <= queried, wanted - queried
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_runbook_sections_and_commands() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    headings = [h.lower() for h in re.findall(r"^## (.+)$", text, re.M)]
    for wanted in (
        "scale a region",
        "drain a region",
        "regional outage",
        "read the hedge metrics",
        "rotate keys",
        "restore after losing postgres",
    ):
        assert any(wanted in h for h in headings), wanted
    assert "worker_prefetch_multiplier" in text and "kubectl" in text
    calls = haco_lines(RUNBOOK)
    assert calls
    for args in calls:
        parse_haco(args)
