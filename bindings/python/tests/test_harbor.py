"""The Harbor adapter against the installed Harbor (needs Python >= 3.12 and `harbor`).

No server is contacted: construction, definition validation, capabilities and the
network-policy mapping are checked on real Harbor objects.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

harbor_base = pytest.importorskip("harbor.environments.base")

from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy  # noqa: E402
from harbor.models.trial.paths import TrialPaths  # noqa: E402

from denv.harbor import DenvEnvironment, _env_name, _trial_name, apply_caps, harbor_compose, interpolate  # noqa: E402
from denv.client import build_contexts, pack_context  # noqa: E402

BaseEnvironment = harbor_base.BaseEnvironment


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENV_API_KEY", "dak_unit")
    monkeypatch.setenv("DENV_SERVER", "http://127.0.0.1:9")


def make(tmp_path: Path, *, files: dict[str, str] | None = None, harbor: dict | None = None, **cfg) -> DenvEnvironment:
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True)
    for name, text in (files or {}).items():
        (env_dir / name).write_text(text)
    policy = cfg.pop("network_policy", None)
    return DenvEnvironment(
        environment_dir=env_dir,
        environment_name="hello",
        session_id="hello__abc123__env",
        trial_paths=TrialPaths(tmp_path / "trial"),
        task_env_config=EnvironmentConfig(**cfg),
        network_policy=policy,
        **(harbor or {}),
    )


def test_implements_every_abstract_method() -> None:
    assert DenvEnvironment.__abstractmethods__ == frozenset()
    for name in BaseEnvironment.__abstractmethods__:
        ours = getattr(DenvEnvironment, name)
        theirs = getattr(BaseEnvironment, name)
        assert ours is not theirs, name
        if name != "type":
            assert list(inspect.signature(ours).parameters) == list(
                inspect.signature(theirs).parameters
            ), name


def test_image_task_constructs(tmp_path: Path) -> None:
    env = make(tmp_path, docker_image="python:3.12-slim")
    assert env.type() == "denv"
    caps = env.capabilities
    assert caps.disable_internet and caps.docker_compose and not caps.mounted
    assert env._egress == "allow"  # Harbor's default network_mode is public
    assert env.env_id is None


def test_no_network_is_accepted_and_denied(tmp_path: Path) -> None:
    env = make(
        tmp_path,
        docker_image="python:3.12-slim",
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
    )
    assert env._egress == "deny"


def test_legacy_allow_internet_false_maps_to_deny(tmp_path: Path) -> None:
    from harbor.models.task.config import TaskConfig

    toml = '[environment]\ndocker_image = "busybox:1.36"\nallow_internet = false\n'
    with pytest.warns(DeprecationWarning):
        cfg = TaskConfig.model_validate_toml(toml).environment
    assert cfg.network_mode == NetworkMode.NO_NETWORK
    env = make(tmp_path, docker_image="busybox:1.36", network_policy=cfg.resolve_baseline())
    assert env._egress == "deny"


def test_allowlist_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowlist"):
        make(
            tmp_path,
            docker_image="busybox:1.36",
            network_policy=NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["example.com"]),
        )


def test_dockerfile_only_builds_harbors_implicit_main(tmp_path: Path) -> None:
    env = make(tmp_path, files={"Dockerfile": "FROM busybox:1.36\n"}, env={"GREETING": "hi"})
    variables = env._compose_variables()
    ctx = str(env.environment_dir.resolve())
    assert variables["CONTEXT_DIR"] == ctx
    assert variables["MAIN_IMAGE_NAME"].startswith("hb__")
    assert "PREBUILT_IMAGE_NAME" not in variables
    doc = harbor_compose(env.environment_dir, None, variables, env._startup_env())
    assert doc == {
        "services": {
            "main": {
                "build": {"context": ctx},
                "command": ["sh", "-c", "sleep infinity"],
                "environment": {"GREETING": "hi"},
            }
        }
    }
    contexts = build_contexts(doc, env.environment_dir)
    assert list(contexts) == [ctx]


def test_compose_build_merges_over_main_with_harbors_variables(tmp_path: Path) -> None:
    compose = """services:
  main:
    build:
      context: ${CONTEXT_DIR}
      args: {TAG: "${TAG:-dev}", NAME: "${MAIN_IMAGE_NAME}"}
    image: ${MAIN_IMAGE_NAME}
    environment: ["A=1", "COST=$$5"]
    depends_on: [db]
  db:
    build: ./db
    environment: {LIMIT: "${MEMORY:-none}"}
"""
    env = make(
        tmp_path,
        files={"Dockerfile": "FROM busybox:1.36\n", "docker-compose.yaml": compose},
        memory_mb=512,
    )
    (env.environment_dir / "db").mkdir()
    (env.environment_dir / "db" / "Dockerfile").write_text("FROM busybox:1.36\n")
    v = env._compose_variables()
    doc = harbor_compose(env.environment_dir, env._compose_path, v, {})
    main = doc["services"]["main"]
    ctx = str(env.environment_dir.resolve())
    assert main["build"] == {"context": ctx, "args": {"TAG": "dev", "NAME": v["MAIN_IMAGE_NAME"]}}
    assert main["image"] == v["MAIN_IMAGE_NAME"]
    assert main["command"] == ["sh", "-c", "sleep infinity"], "the implicit main's command stays"
    assert main["environment"] == ["A=1", "COST=$5"]
    assert doc["services"]["db"]["environment"] == {"LIMIT": "512M"}
    assert sorted(build_contexts(doc, env.environment_dir)) == sorted([ctx, "./db"])


def test_compose_sees_only_passed_variables_never_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A downloaded task asks for the caller's secrets.
    compose = """services:
  main:
    image: busybox:1.36
    environment: {KEY: "${DENV_API_KEY}", AWS: "${AWS_SECRET_ACCESS_KEY}", OK: "${REGION}", H: "${HOME}"}
"""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("REGION", "eu")
    monkeypatch.setenv("DENV_HARBOR_PASS_ENV", "REGION, DENV_API_KEY,NOT_SET")
    env = make(tmp_path, files={"docker-compose.yaml": compose})
    v = env._compose_variables()
    doc = harbor_compose(env.environment_dir, env._compose_path, v, {})
    assert doc["services"]["main"]["environment"] == {"KEY": "", "AWS": "", "OK": "eu", "H": ""}
    assert "dak_unit" not in repr(doc)


def test_build_contexts_outside_the_task_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("private")
    env = make(tmp_path, files={"Dockerfile": "FROM busybox:1.36\n"})
    (env.environment_dir / "link").symlink_to(secret)
    (env.environment_dir.parent / "shared").mkdir()
    for ctx in ["../../secret", str(secret), "link"]:
        doc = {"services": {"main": {"build": {"context": ctx}}}}
        with pytest.raises(ValueError, match="outside"):
            build_contexts(doc, env.environment_dir, root=env.environment_dir.parent)
    # Inside the task (environment/ itself, or a sibling of it) is fine.
    doc = {"services": {"a": {"build": "."}, "b": {"build": "../shared"}}}
    assert sorted(build_contexts(doc, env.environment_dir, root=env.environment_dir.parent)) == [
        ".", "../shared",
    ]


def test_interpolation_forms() -> None:
    env = {"A": "a", "E": ""}
    assert interpolate("$A ${A} ${B} $$A", env) == "a a  $A"
    assert interpolate("${E:-d} ${E-d} ${B:-${A}} ${A:+alt} ${B+alt}", env) == "d  a alt "
    with pytest.raises(ValueError, match="required variable B is missing a value: need B"):
        interpolate("${B:?need B}", env)


def test_pack_context_is_deterministic_and_stores_links(tmp_path: Path) -> None:
    import io
    import os
    import tarfile
    import time

    (tmp_path / "sub").mkdir()
    (tmp_path / "Dockerfile").write_text("FROM busybox:1.36\n")
    (tmp_path / "sub" / "x").write_text("x")
    os.symlink("/etc/passwd", tmp_path / "link")
    one = pack_context(tmp_path)
    time.sleep(0.02)
    (tmp_path / "sub" / "x").write_text("x")
    assert pack_context(tmp_path) == one
    names = [(m.name, m.linkname, m.mtime) for m in tarfile.open(fileobj=io.BytesIO(one))]
    assert names == [("Dockerfile", "", 0), ("link", "/etc/passwd", 0), ("sub", "", 0), ("sub/x", "", 0)]


def test_pack_context_refuses_over_32_mib(tmp_path: Path) -> None:
    with open(tmp_path / "big.bin", "wb") as f:
        f.truncate(32 * 1024 * 1024 + 1)
    with pytest.raises(ValueError, match=r"larger than 32 MiB \(stopped at big.bin\)"):
        pack_context(tmp_path)


def test_compose_task_constructs(tmp_path: Path) -> None:
    env = make(tmp_path, files={"docker-compose.yaml": "services:\n  main:\n    image: busybox:1.36\n"})
    assert env._uses_compose


def test_no_definition_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        make(tmp_path)


def test_missing_key_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DENV_API_KEY")
    with pytest.raises(RuntimeError, match="DENV_API_KEY is not set"):
        make(tmp_path, docker_image="busybox:1.36")


def test_exec_before_start_is_an_error(tmp_path: Path) -> None:
    import asyncio

    env = make(tmp_path, docker_image="busybox:1.36")
    with pytest.raises(RuntimeError, match="not started"):
        asyncio.run(env.exec("true"))


def test_session_names() -> None:
    assert _trial_name("hello__abc__env") == ("hello__abc", "agent")
    assert _trial_name("hello__abc__verifier__trial") == ("hello__abc", "verifier")
    assert _env_name("Hello-World__bZZ__env") == "harbor-hello-world-bzz-env"
    assert len(_env_name("x" * 200)) <= 63


def test_loads_through_harbor_import_path() -> None:
    from harbor.environments.factory import EnvironmentFactory

    cls = EnvironmentFactory.get_environment_class(import_path="denv.harbor:DenvEnvironment")
    assert cls is DenvEnvironment


# ---------------------------------------------------------------- task resources


def test_resources_are_hard_limits_with_fractional_cpus() -> None:
    caps = DenvEnvironment.resource_capabilities()
    assert caps.cpu_limit and caps.memory_limit and caps.fractional_cpus
    assert not caps.cpu_request and not caps.memory_request


def test_task_toml_resources_become_caps(tmp_path: Path) -> None:
    from harbor.models.task.config import TaskConfig

    toml = '[environment]\ndocker_image = "busybox:1.36"\ncpus = 0.5\nmemory_mb = 64\nstorage_mb = 1024\ngpus = 0\n'
    cfg = TaskConfig.model_validate_toml(toml).environment
    env = make(tmp_path, **cfg.model_dump(exclude_unset=True))
    # Harbor's own preflight accepts a fractional CPU on this backend.
    env._validate_resource_mode_support()
    assert env._resource_caps() == {"cpus": 0.5, "memory": "64m", "disk": "1024m"}


def test_no_task_resources_sends_no_caps(tmp_path: Path) -> None:
    assert make(tmp_path, docker_image="busybox:1.36")._resource_caps() == {}


def test_overrides_and_modes_follow_harbor(tmp_path: Path) -> None:
    from harbor.models.trial.config import ResourceMode

    env = make(
        tmp_path / "a",
        docker_image="busybox:1.36",
        cpus=4,
        memory_mb=4096,
        harbor={"override_cpus": 1, "override_memory_mb": 256, "override_storage_mb": 2048},
    )
    assert env._resource_caps() == {"cpus": 1.0, "memory": "256m", "disk": "2048m"}
    # `ignore` sends nothing for that resource.
    env = make(
        tmp_path / "b",
        docker_image="busybox:1.36",
        cpus=2,
        memory_mb=512,
        harbor={"cpu_enforcement_policy": ResourceMode.IGNORE, "memory_enforcement_policy": ResourceMode.IGNORE},
    )
    assert env._resource_caps() == {}
    # A cap is a limit, not a reservation: Harbor's own preflight refuses `request`
    # on this backend from resource_capabilities().
    with pytest.raises(ValueError, match="denv environment does not support memory resource requests"):
        make(
            tmp_path / "c",
            docker_image="busybox:1.36",
            memory_mb=512,
            harbor={"memory_enforcement_policy": ResourceMode.REQUEST},
        )


def test_compose_tasks_cap_main_only(tmp_path: Path) -> None:
    compose = """services:
  main:
    image: busybox:1.36
    cpus: 3
    mem_limit: 8g
  db:
    image: busybox:1.36
    mem_limit: 1g
x-denv:
  disk: 20g
"""
    env = make(tmp_path, files={"docker-compose.yaml": compose}, cpus=0.5, memory_mb=64, storage_mb=512)
    doc = harbor_compose(env.environment_dir, env._compose_path, env._compose_variables(), {})
    apply_caps(doc, env._resource_caps())
    assert doc["services"]["main"]["cpus"] == 0.5
    assert doc["services"]["main"]["mem_limit"] == "64m"
    assert doc["services"]["db"]["mem_limit"] == "1g", "other services keep their caps"
    assert doc["x-denv"]["disk"] == "512m"
    # Without task resources the file's caps stay.
    env2 = make(tmp_path / "b", files={"docker-compose.yaml": compose})
    doc2 = harbor_compose(env2.environment_dir, env2._compose_path, env2._compose_variables(), {})
    apply_caps(doc2, env2._resource_caps())
    assert doc2["services"]["main"]["cpus"] == 3 and doc2["x-denv"]["disk"] == "20g"
