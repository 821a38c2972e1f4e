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


def test_dockerfile_and_build_only_are_clear_errors(tmp_path: Path) -> None:
    d = tmp_path / "Dockerfile"
    d.write_text("FROM busybox:1.36\n")
    with pytest.raises(ValueError, match="Dockerfile: image builds on the denv host are not available"):
        resolve_config(str(d))
    with pytest.raises(ValueError, match="image builds on the denv host are not available"):
        asyncio.run(DenvSandbox.task_init("t", str(d)))
    c = tmp_path / "compose.yaml"
    c.write_text("services:\n  default:\n    build: .\n")
    with pytest.raises(ValueError, match="has build: and no image: image builds on the denv host"):
        resolve_config(str(c))


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
