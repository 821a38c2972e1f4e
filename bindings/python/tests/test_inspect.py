"""The Inspect provider's config forms and registration (no server needed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from denv.inspect import DenvSandbox, DenvSandboxConfig, adapt_compose, resolve_config  # noqa: E402


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENV_API_KEY", "dak_unit")
    monkeypatch.delenv("DENV_SANDBOX_IMAGE", raising=False)


def test_bare_denv_uses_default_image(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_config(None) == DenvSandboxConfig(image="python:3.12-slim")
    monkeypatch.setenv("DENV_SANDBOX_IMAGE", "busybox:1.36")
    cfg = resolve_config(None)
    assert (cfg.image, cfg.egress, cfg.service, cfg.volumes) == ("busybox:1.36", "deny", "main", ("/work",))


def test_yaml_file_forms(tmp_path: Path) -> None:
    img = tmp_path / "denv.yaml"
    img.write_text("image: python:3.12-slim\negress: allow\nvolumes: [/work, /data]\n")
    cfg = resolve_config(str(img))
    assert (cfg.image, cfg.egress, cfg.volumes) == ("python:3.12-slim", "allow", ("/work", "/data"))
    ver = tmp_path / "denv.yml"
    ver.write_text("from_version: ver_01ABC\nservice: opsbox\n")
    cfg = resolve_config(str(ver))
    assert (cfg.from_version, cfg.service, cfg.image) == ("ver_01ABC", "opsbox", None)


def test_version_string_and_inline_model() -> None:
    assert resolve_config("ver_01XYZ").from_version == "ver_01XYZ"
    inline = DenvSandboxConfig(image="busybox:1.36", service="box")
    assert resolve_config(inline) is inline
    assert resolve_config({"image": "busybox:1.36"}).image == "busybox:1.36"


@pytest.mark.parametrize("bad", ["python:3.12-slim", "nope.yaml"])
def test_bare_non_file_string_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        resolve_config(bad)


def test_both_or_neither_source_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        resolve_config(DenvSandboxConfig(image="a", from_version="ver_1"))
    bad = tmp_path / "denv.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ValueError):
        resolve_config(str(bad))
    with pytest.raises(ValueError):
        DenvSandboxConfig(image="a", egress="sometimes")  # type: ignore[arg-type]


def test_provider_surface() -> None:
    assert DenvSandbox.config_files() == [
        "denv.yaml", "denv.yml", "compose.yaml", "compose.yml",
        "docker-compose.yaml", "docker-compose.yml", "Dockerfile",
    ]
    assert DenvSandbox.is_docker_compatible() is True
    assert DenvSandbox.default_concurrency() == 8
    assert DenvSandbox.config_deserialize({"image": "x"}) == DenvSandboxConfig(image="x")
    sbx = DenvSandbox(client=None, env_id="env_1", service="box")  # type: ignore[arg-type]
    conn = asyncio.run(sbx.connection())
    assert conn.command == "denv exec --service box env_1 -- sh"
    assert conn.type == "denv"
    conn = asyncio.run(sbx.connection(user="root; id"))
    assert conn.command == "denv exec --user 'root; id' --service box env_1 -- sh"


def test_inline_config_is_hashable() -> None:
    # Inspect hashes sandbox specs; a list field made this `unhashable type: 'list'`.
    cfg = DenvSandboxConfig(image="busybox:1.36", volumes=["/work", "/data"])  # type: ignore[arg-type]
    assert hash(cfg) == hash(DenvSandboxConfig(image="busybox:1.36", volumes=("/work", "/data")))
    from inspect_ai.util import SandboxEnvironmentSpec

    spec = SandboxEnvironmentSpec("denv", cfg)
    assert {spec: 1}[spec] == 1


COMPOSE = """
services:
  default:
    image: busybox:1.36
    command: tail -f /dev/null
    working_dir: /srv
    network_mode: none
    init: true
    x-local: true
  helper:
    image: busybox:1.36
    x-default: false
"""


def test_compose_file_is_used_not_dropped(tmp_path: Path) -> None:
    import yaml

    f = tmp_path / "compose.yaml"
    f.write_text(COMPOSE)
    cfg = resolve_config(str(f))
    assert cfg.compose == COMPOSE and cfg.image is None
    text, order, workdirs = adapt_compose(cfg.compose, cfg.egress)
    doc = yaml.safe_load(text)
    assert order == ["default", "helper"]
    assert workdirs == {"default": "/srv"}
    assert "working_dir" not in doc["services"]["default"]
    assert "network_mode" not in doc["services"]["default"]
    assert doc["x-denv"]["egress"] == "deny"
    # x-default picks the default service; without one, the first.
    _, order, _ = adapt_compose("services:\n  a: {image: x}\n  b: {image: y, x-default: true}\n")
    assert order == ["b", "a"]
    _, order, _ = adapt_compose("services:\n  a: {image: x}\n  b: {image: y}\n", "allow")
    assert order == ["a", "b"]


def test_compose_config_model_is_used() -> None:
    from inspect_ai.util import ComposeConfig, ComposeService

    cc = ComposeConfig(services={"default": ComposeService(image="busybox:1.36", command="sleep 1d")})
    cfg = resolve_config(cc)
    assert cfg.compose is not None and "busybox:1.36" in cfg.compose
    assert resolve_config({"services": {"default": {"image": "busybox:1.36"}}}).compose is not None


def test_dockerfile_becomes_inspects_compose_built_on_the_host(tmp_path: Path) -> None:
    import yaml

    from denv.client import build_contexts

    d = tmp_path / "Dockerfile"
    d.write_text("FROM busybox:1.36\nRUN echo built > /built\n")
    (tmp_path / "data.txt").write_text("x")
    cfg = resolve_config(str(d))
    assert cfg.context_dir == str(tmp_path)
    text, order, _ = adapt_compose(cfg.compose or "", cfg.egress)
    doc = yaml.safe_load(text)
    assert order == ["default"]
    assert doc["services"]["default"]["build"] == {"context": ".", "dockerfile": "Dockerfile"}
    assert doc["services"]["default"]["command"] == "tail -f /dev/null"
    assert "network_mode" not in doc["services"]["default"] and doc["x-denv"]["egress"] == "deny"
    ctx = build_contexts(doc, cfg.context_dir)
    assert list(ctx) == ["."] and len(ctx["."]) > 0
    # A named Dockerfile keeps its name; a missing one is a clear error.
    named = tmp_path / "web.Dockerfile"
    named.write_text("FROM busybox:1.36\n")
    assert "dockerfile: web.Dockerfile" in (resolve_config(str(named)).compose or "")
    with pytest.raises(ValueError, match="no such Dockerfile"):
        resolve_config(str(tmp_path / "Dockerfile.missing"))
    # A compose service with only build: is kept for the host to build, its context
    # relative to the compose file's directory.
    c = tmp_path / "compose.yaml"
    c.write_text("services:\n  default:\n    build: .\n")
    cfg = resolve_config(str(c))
    assert cfg.context_dir == str(tmp_path)
    assert yaml.safe_load(adapt_compose(cfg.compose or "")[0])["services"]["default"]["build"] == "."
    asyncio.run(DenvSandbox.task_init("t", str(d)))


def test_caps_reach_the_request_and_the_default_service() -> None:
    import yaml

    cfg = DenvSandboxConfig(image="busybox:1.36", cpus=0.5, memory="256m", pids=64, disk="1g")
    assert cfg.resources() == {"cpus": 0.5, "memory": "256m", "pids": 64, "disk": "1g"}
    assert DenvSandboxConfig(image="busybox:1.36").resources() == {}
    hash(cfg)
    compose = (
        "services:\n"
        "  helper: {image: busybox:1.36, cpus: 2}\n"
        "  default:\n"
        "    image: busybox:1.36\n"
        "    deploy: {resources: {limits: {cpus: '2', memory: 1g}}}\n"
    )
    text, order, _ = adapt_compose(compose, "deny", {"cpus": 0.5, "memory": "256m", "pids": 64, "disk": "1g"})
    doc = yaml.safe_load(text)
    main = doc["services"]["default"]
    assert order == ["default", "helper"]
    assert (main["cpus"], main["mem_limit"], main["pids_limit"]) == (0.5, "256m", 64)
    assert main["deploy"]["resources"]["limits"] == {}
    assert doc["services"]["helper"] == {"image": "busybox:1.36", "cpus": 2}
    assert doc["x-denv"]["disk"] == "1g"


def test_task_init_fails_fast_without_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DENV_API_KEY")
    with pytest.raises(RuntimeError, match="DENV_API_KEY is not set"):
        asyncio.run(DenvSandbox.task_init("t", None))
    monkeypatch.setenv("DENV_API_KEY", "dak_x")
    with pytest.raises(ValueError):
        asyncio.run(DenvSandbox.task_init("t", "python:3.12-slim"))
    asyncio.run(DenvSandbox.task_init("t", "ver_01"))


def test_registered_through_the_entry_point_only() -> None:
    # Inspect loads plugins from the `inspect_ai` entry-point group; nothing here
    # imports denv.inspect before the registry lookup.
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="inspect_ai") if ep.name == "denv"]
    assert [ep.value for ep in eps] == ["denv._inspect_registry"]
    from inspect_ai._util.entrypoints import ensure_entry_points
    from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

    ensure_entry_points()
    assert registry_find_sandboxenv("denv").__name__ == "DenvSandbox"
