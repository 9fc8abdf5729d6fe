"""compose/: the deployment file is well-formed and points at things that exist (Docker itself
is not available to the tests; the jobs it runs are run locally in test_jobs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def test_services_and_volumes(compose):
    services = compose["services"]
    assert {"gateway", "redis", "spark-master", "spark-worker", "jobs"} <= set(services)
    assert "braid-data" in compose["volumes"]
    assert "braid-data:/data" in services["gateway"]["volumes"]
    # Spark reads the gateway's log in place, never writing to it.
    for name in ("spark-worker", "jobs"):
        assert "braid-data:/data:ro" in services[name]["volumes"]
    assert services["redis"]["image"].startswith("redis:")
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    published = [port.split(":")[0] for port in services["gateway"]["ports"]]
    assert {"5672", "1883", "9092"} <= set(published)
    all_published = published + [p.split(":")[0] for p in services["spark-master"]["ports"]]
    assert len(all_published) == len(set(all_published)), "host ports must not clash"


def test_builds_point_at_dockerfiles_whose_sources_exist(compose):
    for name, service in compose["services"].items():
        build = service.get("build")
        if build is None:
            continue
        context = (COMPOSE / build["context"]).resolve()
        assert context == REPO, name
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), name
        text = dockerfile.read_text()
        for source in re.findall(r"^COPY (?!--from)(\S+) ", text, flags=re.MULTILINE):
            assert (context / source).exists(), f"{dockerfile.name}: COPY {source}"
        ignore = Path(str(dockerfile) + ".dockerignore")
        assert ignore.is_file(), f"{dockerfile.name} needs its own .dockerignore"
        assert "FROM " in text


def test_the_jobs_service_runs_the_example_jobs(compose):
    command = " ".join(compose["services"]["jobs"]["command"])
    names = re.search(r"for job in ([\w ]+);", command)
    assert names is not None
    for job in names.group(1).split():
        module = REPO / "spark" / "jobs" / f"{job}.py"
        assert module.is_file(), job
        assert "def main(" in module.read_text()
    assert "/data /results" in command
