"""compose/: the Docker Compose stack of a HACO fleet, checked without a Docker engine.

Every service's command is parsed by the real `haco` CLI (the typer app's click
commands: unknown subcommands or options fail), every ``${VAR}`` is in .env.example, every
``HACO_*`` name is a HacoSettings field and the values validate, and every zone of the
sample pool has a worker consuming its queue. ``docker compose config`` itself runs only
where the compose plugin is installed (not on this machine); its YAML-level equivalents
are :func:`test_yaml_level_equivalents_of_docker_compose_config`, which always runs.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from coordinator.cli.main import app
from coordinator.config import HacoSettings
from coordinator.runtime.pool import default_pool, load_pool
from coordinator.state.keys import BROKER_DB, queue_for

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
SIM_POOL = COMPOSE_DIR / "pools" / "sim.toml"
VAR_REF = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")
BARE_VAR = re.compile(r"(?<!\$)\$[A-Za-z_]")
SETTINGS = {f"HACO_{name.upper()}" for name in HacoSettings.model_fields}
SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "volumes",
    "ports", "depends_on", "restart", "healthcheck", "profiles", "stop_grace_period",
}  # fmt: skip
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
GRACE_MARGIN_S = 15.0


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    return data


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def env_example() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f".env.example: {line!r} is not NAME=value"
            out[name.strip()] = value.strip()
    return out


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}, against ``env``."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        if name in env and (env[name] or op not in (":-", ":?")):
            return env[name]
        assert op not in (":?", "?"), f"${{{name}}} is required and unset"
        return arg if op in (":-", "-") else ""

    return VAR_REF.sub(one, text).replace("$$", "$")


def parse_haco(args: list[str]) -> tuple[str, dict[str, Any]]:
    """The `haco` subcommand ``args`` name and its parsed options; fails (raises) on an
    unknown subcommand or option, or a bad value, as `haco` itself would."""
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    cmd: Any = group
    path: list[str] = []
    rest = list(args)
    while hasattr(cmd, "commands"):
        assert rest and rest[0] in cmd.commands, f"haco {' '.join(args)}: no such subcommand"
        path.append(rest[0])
        cmd = cmd.commands[rest.pop(0)]
    ctx = cmd.make_context(" ".join(["haco", *path]), rest)
    return " ".join(path), dict(ctx.params)


def haco_services() -> dict[str, dict[str, Any]]:
    """The services running the HACO image's entrypoint (`haco`)."""
    return {
        name: svc for name, svc in services().items() if "build" in svc and "entrypoint" not in svc
    }


def seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)(s|m)", duration)
    assert m, f"duration {duration!r}: expected <n>s or <n>m"
    return float(m.group(1)) * (60 if m.group(2) == "m" else 1)


def service_env(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    assert isinstance(env, dict), "environment: use the mapping form"
    return {str(k): str(v) for k, v in env.items()}


def test_every_haco_service_runs_a_real_subcommand() -> None:
    found = {name: parse_haco(svc["command"])[0] for name, svc in haco_services().items()}
    assert found["migrate"] == "migrate"
    assert found["api"] == "serve"
    assert found["beat"] == "beat"
    assert found["harvester"] == "harvester"
    assert found["judge"] == "worker"
    assert set(found.values()) <= {"migrate", "serve", "beat", "harvester", "worker"}


def test_parse_haco_rejects_what_haco_rejects() -> None:
    with pytest.raises(Exception, match="zonex"):
        parse_haco(["worker", "--zonex", "local"])
    with pytest.raises(AssertionError, match="no such subcommand"):
        parse_haco(["wroker"])


def test_every_zone_of_the_sample_pool_has_a_worker_on_its_queue() -> None:
    pool = load_pool(SIM_POOL)
    assert pool.zones == default_pool().zones  # the paper's pool, plus a simulated judge
    assert pool.evaluator is not None  # so that `haco worker --judge` starts
    consumed: dict[str, list[str]] = {}
    for name, svc in haco_services().items():
        cmd, params = parse_haco(svc["command"])
        if cmd == "worker" and params["zone"] is not None:
            consumed.setdefault(queue_for(params["zone"]), []).append(name)
    assert set(consumed) == {queue_for(z) for z in pool.zones}
    for zone in pool.zones:
        assert consumed[queue_for(zone)] == [f"worker-{zone}"]
    _, judge = parse_haco(services()["judge"]["command"])
    assert judge["judge"] is True


def test_zone_workers_scale_and_drain() -> None:
    """`--scale worker-<zone>=N` needs no fixed name or host port; a stopped worker gets
    the longest deadline plus a margin to finish its members (Celery warm shutdown)."""
    env = env_example()
    deadline = float(env["HACO_DEFAULT_DEADLINE_S"])
    pool_deadlines = [d for d in [load_pool(SIM_POOL).defaults.deadline_s] if d is not None]
    for name, svc in services().items():
        if not name.startswith("worker-") and name != "judge":
            continue
        assert "container_name" not in svc and "ports" not in svc, name
        assert svc["profiles"] == ["sim"], name
        grace = seconds(interpolate(svc["stop_grace_period"], env))
        assert grace >= max([deadline, *pool_deadlines]) + GRACE_MARGIN_S, name


def test_variables_are_in_env_example_and_settings_are_real() -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    assert not BARE_VAR.search(text), "use ${VAR}, or $$ for the container's shell"
    referenced = {m.group(1) for m in VAR_REF.finditer(text)}
    env = env_example()
    assert referenced <= set(env), f"missing from .env.example: {referenced - set(env)}"
    assert set(env) <= referenced | {"COMPOSE_PROFILES"}, "unused in .env.example"
    haco_names = {n for n in env if n.startswith("HACO_")}
    for svc in services().values():
        haco_names |= {k for k in service_env(svc) if k.startswith("HACO_")}
    assert "HACO_IMAGE" in haco_names  # the image tag: compose's, not a setting
    assert haco_names - {"HACO_IMAGE"} <= SETTINGS, haco_names - SETTINGS


def test_settings_values_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_example()
    for name, svc in haco_services().items():
        for key in SETTINGS:
            monkeypatch.delenv(key, raising=False)
        resolved = {k: interpolate(v, env) for k, v in service_env(svc).items()}
        for key, value in resolved.items():
            monkeypatch.setenv(key, value)
        settings = HacoSettings()
        assert settings.redis_url == "redis://redis:6379/0", name
        assert settings.database_url is not None
        assert settings.database_url.endswith("@postgres:5432/haco"), name
        assert str(settings.pool_file) == "/etc/haco/pool.toml", name


def test_flower_watches_the_broker_with_events_on() -> None:
    flower = services()["flower"]
    assert flower["entrypoint"] == ["celery"]
    assert f"--broker=redis://redis:6379/{BROKER_DB}" in flower["command"]
    assert "flower" in flower["command"]
    for name, svc in haco_services().items():
        if parse_haco(svc["command"])[0] == "worker":
            assert service_env(svc)["HACO_TASK_EVENTS"].startswith("${HACO_TASK_EVENTS"), name
    assert env_example()["HACO_TASK_EVENTS"] == "true"


def test_healthchecks_and_dependencies() -> None:
    svcs = services()
    assert svcs["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "--appendonly" in svcs["redis"]["command"]
    assert svcs["redis"]["command"][svcs["redis"]["command"].index("--appendonly") + 1] == "yes"
    assert "pg_isready" in " ".join(svcs["postgres"]["healthcheck"]["test"])
    assert "/healthz" in " ".join(svcs["api"]["healthcheck"]["test"])
    _, serve = parse_haco(svcs["api"]["command"])
    assert serve["host"] == "0.0.0.0"
    assert svcs["api"]["ports"] == [f"${{API_PORT:-8000}}:{serve['port']}"]
    assert svcs["migrate"]["restart"] == "no"
    assert svcs["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, svc in haco_services().items():
        if name == "migrate":
            continue
        deps = svc["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == "service_healthy", name
    for name in ("worker-local", "worker-regional", "worker-global", "judge"):
        test = " ".join(svcs[name]["healthcheck"]["test"])
        assert "inspect ping" in test, name
        node = service_env(svcs[name])["CELERY_NODE"]
        assert node == ("haco-judge" if name == "judge" else f"haco-{name.split('-', 1)[1]}")


def test_named_volumes_are_declared_and_used() -> None:
    data = compose()
    declared = set(data["volumes"])
    used: set[str] = set()
    for svc in data["services"].values():
        for vol in svc.get("volumes", []):
            if isinstance(vol, str):
                source = vol.split(":", 1)[0]
                if not source.startswith((".", "/", "$")):
                    used.add(source)
            else:
                assert vol["type"] == "bind"
    assert used == declared == {"redis-data", "pg-data", "beat-state"}


def test_dockerfile_builds_the_haco_image() -> None:
    text = (COMPOSE_DIR / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert "RUN pip install ." in text
    assert 'ENTRYPOINT ["haco"]' in text
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    for m in re.finditer(r"^COPY (.+) \S+$", text, re.M):
        for src in m.group(1).split():
            assert (ROOT / src).exists(), src
            assert src.split("/")[0] not in ignored, f"{src} is excluded by .dockerignore"
    assert services()["api"]["build"] == {"context": "..", "dockerfile": "compose/Dockerfile"}


def test_yaml_level_equivalents_of_docker_compose_config() -> None:
    """What `docker compose config` would reject, checked on the YAML: unknown top-level
    or service keys, dependencies on unknown services or with unknown conditions, a
    required variable left unset, healthcheck and port forms. Always runs (the plugin
    is absent here; test_docker_compose_config runs the real thing where it exists)."""
    data = compose()
    assert set(data) - {"name"} == {k for k in data if k.startswith("x-")} | {
        "services",
        "volumes",
    }
    env = env_example()
    interpolate(COMPOSE_FILE.read_text(encoding="utf-8"), env)  # every :? variable set
    for name, svc in data["services"].items():
        assert set(svc) <= SERVICE_KEYS, f"{name}: {set(svc) - SERVICE_KEYS}"
        assert "image" in svc, name
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in data["services"], f"{name} depends on unknown {dep}"
            assert spec["condition"] in CONDITIONS, name
        check = svc.get("healthcheck")
        if check is not None:
            assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        for port in svc.get("ports", []):
            assert re.fullmatch(r"\d+:\d+", interpolate(port, env)), f"{name}: {port}"
        assert isinstance(svc.get("command", []), list), f"{name}: use the list form"


def _compose_plugin() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    probe = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, check=False, timeout=30
    )
    return probe.returncode == 0


@pytest.mark.skipif(
    not _compose_plugin(),
    reason="the docker compose plugin is absent: "
    "test_yaml_level_equivalents_of_docker_compose_config checks the YAML instead",
)
def test_docker_compose_config() -> None:
    docker = shutil.which("docker")
    assert docker is not None
    for profile in ([], ["--profile", "sim"]):
        base = [docker, "compose", "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE)]
        run = subprocess.run(
            [*base, *profile, "config", "--quiet"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr


def haco_lines(markdown: Path) -> list[list[str]]:
    """The arguments of every `haco ...` call in the fenced code blocks of ``markdown``."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", markdown.read_text(encoding="utf-8"), re.S)
    calls = []
    for block in blocks:
        joined = block.replace("\\\n", " ")  # continued lines
        for m in re.finditer(r"(?:^|(?<!-n)\s)haco ([a-z][^\n#|;&]*)", joined):  # not -n haco
            calls.append(shlex.split(m.group(1)))
    return calls


def test_readme_commands_are_real() -> None:
    calls = haco_lines(COMPOSE_DIR / "README.md")
    assert calls
    for args in calls:
        parse_haco(args)
