"""The deployment files say what the code can do: docker-compose.yml, deploy/Dockerfile, deploy/butler.toml.

There is no Docker engine in the test environment, so these parse the files and check their shape
against the code: every command named exists, every queue a worker consumes is a real shard queue.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from memory_api.cli.main import build_parser
from shared.config import Settings, load_settings
from shared.sharding import MAINTENANCE_QUEUE, shard_queues

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict = COMPOSE["services"]
APP_SERVICES = ("migrate", "front", "worker-1", "worker-2", "beat", "flower")


def _command(service: str) -> list[str]:
    command = SERVICES[service].get("command", [])
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def _option(command: list[str], name: str) -> str | None:
    """The value of ``--name=value`` or ``--name value`` in an argv."""
    for i, part in enumerate(command):
        if part.startswith(f"{name}="):
            return part.split("=", 1)[1]
        if part == name and i + 1 < len(command):
            return command[i + 1]
    return None


def _workers() -> list[str]:
    return [name for name in SERVICES if _command(name)[:1] == ["celery"] and "worker" in _command(name)]


def _depends(service: str) -> dict[str, str]:
    depends = SERVICES[service].get("depends_on", {})
    return (
        {name: "service_started" for name in depends}
        if isinstance(depends, list)
        else {name: spec.get("condition", "service_started") for name, spec in depends.items()}
    )


def _cli_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001 - argparse has no public accessor
    return set(sub.choices)


def test_every_part_of_the_stack_is_a_service():
    assert set(SERVICES) >= {"postgres", "redis", *APP_SERVICES}


def test_databases_use_the_pinned_images_and_keep_their_data():
    assert SERVICES["postgres"]["image"] == "pgvector/pgvector:pg17"
    assert SERVICES["redis"]["image"] == "redis:7"
    assert any(v.endswith(":/var/lib/postgresql/data") for v in SERVICES["postgres"]["volumes"])
    assert any(v.endswith(":/data") for v in SERVICES["redis"]["volumes"])


def test_redis_persists_with_an_append_only_file():
    command = _command("redis")
    assert _option(command, "--appendonly") == "yes"
    assert _option(command, "--appendfsync") == "everysec"


@pytest.mark.parametrize("service,probe", [("postgres", "pg_isready"), ("redis", "redis-cli"), ("front", "/healthz")])
def test_services_others_wait_for_have_a_healthcheck(service, probe):
    test = SERVICES[service]["healthcheck"]["test"]
    assert probe in " ".join(test if isinstance(test, list) else [test])


def test_start_order_migrates_before_anything_uses_the_schema():
    # migrate waits for a healthy postgres
    assert _depends("migrate").get("postgres") == "service_healthy"
    # and the front, every worker and beat wait for the migration to complete
    for service in ("front", "beat", *_workers()):
        assert _depends(service).get("migrate") == "service_completed_successfully", service
    assert _depends("front").get("redis") == "service_healthy"


def test_exactly_one_beat_with_the_redis_scheduler():
    beats = [name for name in SERVICES if _command(name)[:1] == ["celery"] and "beat" in _command(name)]
    assert beats == ["beat"]
    assert _option(_command("beat"), "-S") == "redbeat.RedBeatScheduler"


def test_at_least_two_workers_consume_every_shard_queue():
    # given the shard count the services are configured with
    workers = _workers()
    assert len(workers) >= 2
    for worker in workers:
        count = int(SERVICES[worker]["environment"]["MEMORY_BUTLER_WORKERS__SHARD_COUNT"])
        # then each worker consumes exactly the shard queues of that count, plus maintenance
        queues = (_option(_command(worker), "--queues") or _option(_command(worker), "-Q")).split(",")
        assert queues == [*shard_queues(count), MAINTENANCE_QUEUE], worker
        assert "${WORKER_CONCURRENCY" in _option(_command(worker), "--concurrency")


def test_flower_requires_basic_auth_from_the_environment():
    auth = _option(_command("flower"), "--basic-auth")
    assert auth and auth.startswith("${FLOWER_BASIC_AUTH")


def test_front_and_flower_ports_are_published():
    assert "8150:8150" in SERVICES["front"]["ports"]
    assert "5555:5555" in SERVICES["flower"]["ports"]


def test_app_services_share_the_connection_settings_and_the_image():
    for service in APP_SERVICES:
        env = SERVICES[service]["environment"]
        assert env["DATABASE_URL"] == "postgresql://memory:memory@postgres:5432/butler_memory", service
        assert env["REDIS_URL"] == "redis://redis:6379/0", service
        assert SERVICES[service]["build"]["dockerfile"] == "deploy/Dockerfile", service


def test_every_memory_butler_command_in_compose_exists():
    # given the sub-commands the CLI registers
    registered = _cli_commands()
    used = {_command(s)[1] for s in SERVICES if _command(s)[:1] == ["memory-butler"]}
    assert used >= {"migrate", "serve"}
    # then each one used is registered; `serve` only once its module exists
    if importlib.util.find_spec("memory_api.cli.serve") is None:
        used.discard("serve")
    assert used <= registered, used - registered


def test_every_celery_app_is_a_module_in_the_repo():
    targets = {_option(_command(s), "-A") for s in SERVICES if _command(s)[:1] == ["celery"]}
    assert targets == {"memory_workers.app:app"}
    module_file = ROOT / "memory_workers" / "app.py"
    if not module_file.is_file():
        pytest.skip("memory_workers/app.py is not written yet; the celery -A target cannot be checked")
    assert module_file.is_file()


def test_dockerfile_installs_cpu_torch_then_the_project():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    torch = dockerfile.index("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    assert torch < dockerfile.index("RUN pip install .")


# Written as one inline table each ({ cron = ..., prompt = ... }), so documented as one key.
SCHEDULE_ENTRIES = {
    "schedule.consolidate",
    "schedule.decay_sweep",
    "schedule.episode_cleanup",
    "schedule.event_partitions",
}


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every leaf settings key as a dotted path."""
    keys = set()
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel) and prefix + name not in SCHEDULE_ENTRIES:
            keys |= _keys(kind, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def _toml_keys(table: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in table.items():
        # An empty inline table (`tenants = {}`) documents a map-valued key, not a section.
        is_section = isinstance(value, dict) and bool(value) and prefix + name not in SCHEDULE_ENTRIES
        keys |= _toml_keys(value, f"{prefix}{name}.") if is_section else {prefix + name}
    return keys


def test_example_butler_toml_documents_every_key_with_its_default(monkeypatch, tmp_path):
    # given the example file and an empty one, under the same environment
    example = ROOT / "deploy" / "butler.toml"
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv("MEMORY_BUTLER_CONFIG", str(example))
    from_example = load_settings()
    monkeypatch.setenv("MEMORY_BUTLER_CONFIG", str(empty))
    # then loading the example changes nothing
    assert from_example == load_settings()
    # and it names every setting but the ones that belong in the environment (secrets, paths)
    butler = tomllib.loads(example.read_text())["butler"]
    documented = _toml_keys({k: v for k, v in butler.items() if k not in ("name", "description", "db")})
    documented = {"api.port" if key == "port" else key for key in documented}
    assert documented == _keys(Settings) - {
        "database_url",
        "redis_url",
        "data_dir",
        "workers.metrics_dir",
        "database_read_url",
    }


def test_the_shared_front_limits_each_token_and_the_embedded_stack_does_not():
    env = SERVICES["front"]["environment"]
    assert env["DATABASE_URL"] == SERVICES["migrate"]["environment"]["DATABASE_URL"]
    api = Settings(
        **{
            "api": {
                "token_rate_per_second": float(env["MEMORY_BUTLER_API__TOKEN_RATE_PER_SECOND"]),
                "token_burst": int(env["MEMORY_BUTLER_API__TOKEN_BURST"]),
                "token_max_concurrent": int(env["MEMORY_BUTLER_API__TOKEN_MAX_CONCURRENT"]),
            }
        }
    ).api
    assert api.token_rate_per_second > 0 and api.token_burst > 0 and api.token_max_concurrent > 0
    assert set(k for k in env if k.startswith("MEMORY_BUTLER_API__")) == {
        "MEMORY_BUTLER_API__TOKEN_RATE_PER_SECOND",
        "MEMORY_BUTLER_API__TOKEN_BURST",
        "MEMORY_BUTLER_API__TOKEN_MAX_CONCURRENT",
    }
    default = load_settings().api
    assert (default.token_rate_per_second, default.token_burst, default.token_max_concurrent) == (0, 0, 0)


PROMETHEUS = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())


def _scrape_job(name: str) -> dict:
    return next(job for job in PROMETHEUS["scrape_configs"] if job["job_name"] == name)


def _targets(job: dict) -> set[str]:
    return {t for static in job["static_configs"] for t in static["targets"]}


def test_prometheus_runs_with_the_repos_config_and_rules():
    prometheus = SERVICES["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus:v2.")  # pinned, not :latest
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert any(v.endswith(":/prometheus") for v in prometheus["volumes"])  # its TSDB survives a restart
    assert "--config.file=/etc/prometheus/prometheus.yml" in _command("prometheus")
    assert "9090:9090" in prometheus["ports"]
    # the rules it loads are the ones tests/unit/test_alert_rules.py checks
    assert PROMETHEUS["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert (ROOT / "deploy" / "prometheus" / "alerts.yml").is_file()


def test_prometheus_scrapes_every_front_with_an_operator_token():
    fronts = [s for s in SERVICES if _command(s)[:2] == ["memory-butler", "serve"]]
    job = _scrape_job("memory-butler-front")
    assert _targets(job) == {f"{front}:{_option(_command(front), '--port')}" for front in fronts}
    # /metrics needs a token; an operator token sees the fleet (the file is the operator's, never committed)
    assert job["authorization"]["credentials_file"] == "/etc/prometheus/operator.token"
    assert "deploy/prometheus/operator.token" in (ROOT / ".gitignore").read_text().split()


def test_prometheus_scrapes_every_worker_node_on_its_metrics_port():
    job = _scrape_job("memory-butler-worker")
    ports = {w: SERVICES[w]["environment"]["MEMORY_BUTLER_WORKERS__METRICS_PORT"] for w in _workers()}
    assert _targets(job) == {f"{w}:{port}" for w, port in ports.items()}
    for worker in _workers():
        env = SERVICES[worker]["environment"]
        assert int(env["MEMORY_BUTLER_WORKERS__METRICS_PORT"]) > 0
        assert env["MEMORY_BUTLER_WORKERS__METRICS_HOST"] == "0.0.0.0"  # reachable from the prometheus container
        assert "9150" not in " ".join(SERVICES[worker].get("ports", []))  # and from nowhere else
        # the metrics settings are real settings of the worker
        load_settings(
            workers={
                "metrics_port": int(env["MEMORY_BUTLER_WORKERS__METRICS_PORT"]),
                "metrics_host": env["MEMORY_BUTLER_WORKERS__METRICS_HOST"],
            }
        )


@pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"),
    reason="promtool not installed (Debian's prometheus package; `bash deploy/dev.sh install`)",
)
def test_promtool_accepts_the_prometheus_config(tmp_path):
    # given the config with its /etc/prometheus paths pointed at a copy of deploy/prometheus (and a token file)
    for name in ("alerts.yml", "prometheus.yml"):
        (tmp_path / name).write_text(
            (ROOT / "deploy" / "prometheus" / name).read_text().replace("/etc/prometheus/", f"{tmp_path}/")
        )
    (tmp_path / "operator.token").write_text("mb_placeholder\n")
    # then promtool accepts it and the rules it names
    done = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_streaming_replica_is_made_from_the_primary_with_pg_basebackup():
    # given the replica service
    replica = SERVICES["postgres-replica"]
    assert replica["image"] == SERVICES["postgres"]["image"]
    script = " ".join(_command("postgres-replica"))
    # then its first start copies the primary, writes the standby settings and streams from the primary's slot
    for part in (
        "pg_basebackup",
        "--host=postgres",
        "--username=replicator",
        "--wal-method=stream",
        "--write-recovery-conf",
        "--slot=replica_1",
    ):
        assert part in script, part
    assert 'if [ ! -s "$$PGDATA/PG_VERSION" ]' in script  # later starts resume, never copy over their data
    assert "hot_standby=on" in script
    # on a volume of its own, once the primary is healthy, and healthy only while it is in recovery
    assert any(v.startswith("pgreplica:") and v.endswith(":/var/lib/postgresql/data") for v in replica["volumes"])
    assert "pgreplica" in COMPOSE["volumes"]
    assert _depends("postgres-replica").get("postgres") == "service_healthy"
    assert "pg_is_in_recovery()" in " ".join(replica["healthcheck"]["test"])


def test_the_primary_admits_the_replica():
    # given the primary's init script (mounted into docker-entrypoint-initdb.d)
    mounts = [v for v in SERVICES["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in v]
    assert len(mounts) == 1
    script = (ROOT / mounts[0].split(":")[0]).read_text()
    # then it creates the replication role, the slot the replica streams from, and the pg_hba.conf line
    assert "WITH REPLICATION LOGIN" in script and "CREATE ROLE replicator" in script
    assert "pg_create_physical_replication_slot('replica_1')" in script
    assert "host replication replicator all scram-sha-256" in script
    # and the primary bounds the WAL a lost replica can hold back
    assert any(part.startswith("max_slot_wal_keep_size=") for part in _command("postgres"))
    assert (
        SERVICES["postgres"]["environment"]["REPLICATION_PASSWORD"]
        == SERVICES["postgres-replica"]["environment"]["PGPASSWORD"]
    )


def test_only_the_front_reads_from_the_replica_and_it_does_not_wait_for_it():
    # given the front's read URL
    read_url = SERVICES["front"]["environment"]["DATABASE_READ_URL"]
    primary_url = SERVICES["front"]["environment"]["DATABASE_URL"]
    # then it is the replica service, the same database and user as the primary's
    assert read_url == primary_url.replace("@postgres:", "@postgres-replica:")
    assert load_settings(database_url=primary_url, database_read_url=read_url).read_urls == (read_url,)
    # and reads fail open: the front starts without the replica
    assert "postgres-replica" not in _depends("front")
    # while everything that writes (migrations, workers, beat) uses the primary only
    for service in ("migrate", "beat", *_workers()):
        assert "DATABASE_READ_URL" not in SERVICES[service]["environment"], service
