//! A denv version as an OpenEnv environment package (spec page `33-blog-openenv.md`
//! "Exporting a denv version as an OpenEnv environment"; our `docs/howto/openenv.md`
//! "Export a version").
//!
//! The package is what `openenv init` lays out (`models.py`, `client.py`, `server/app.py`,
//! `server/<env>_environment.py`, `server/Dockerfile`, `openenv.yaml`, `pyproject.toml`),
//! with an environment whose `reset` forks the version through denv's REST API
//! (`POST /v1/sandboxes {from_version}`) instead of restarting a container, whose `step`
//! runs a command in the fork's agent service (`POST /v1/envs/{env}/exec`) or grades the
//! fork (`POST /v1/envs/{env}/verify`, reward from the verdict), and whose `close`
//! destroys the fork. The server needs only `openenv-core` (denv is reached with the
//! standard library), with `DENV_SERVER` and `DENV_API_KEY` from its environment.

use super::{tasks::Task, OutFile};
use anyhow::{anyhow, bail, Result};
use std::path::Path;

/// The Python package name for a project: `<project>_env`, with every character that is
/// not a letter or digit an `_`, and a leading `env_` when it would start with a digit.
pub fn package_name(project: &str) -> String {
    let mut s: String = project
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s = format!("env_{s}");
    }
    format!("{}_env", s.trim_matches('_'))
}

/// A Python string literal (JSON's escapes are valid Python).
fn py(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

const MODELS: &str = r#""""Actions and observations of the __PKG__ environment (denv version __VERSION__)."""

from typing import List, Optional

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class DenvAction(Action):
    """Run ``command`` (an argv) in the fork's agent service, or, with ``verify=True``,
    grade the fork with its verifier (the episode then ends with the verifier's reward)."""

    command: List[str] = Field(default_factory=list, description="argv run in the agent's service")
    verify: bool = Field(default=False, description="grade the episode with denv verify")
    timeout_sec: Optional[int] = Field(default=None, description="seconds before the command is killed")


class DenvObservation(Observation):
    """What a reset or step returns."""

    env_id: str = Field(default="", description="the denv environment of this episode (a fork)")
    task: str = Field(default="", description="the task's name")
    instruction: str = Field(default="", description="the task's instruction")
    stdout: str = Field(default="")
    stderr: str = Field(default="")
    exit_code: Optional[int] = Field(default=None)
"#;

const CLIENT: &str = r#""""Client of the __PKG__ environment (denv version __VERSION__)."""

from typing import Dict

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from .models import DenvAction, DenvObservation


class DenvVersionEnv(EnvClient[DenvAction, DenvObservation, State]):
    """A WebSocket session with the server; each ``reset()`` is a new fork of the version."""

    def _step_payload(self, action: DenvAction) -> Dict:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: Dict) -> StepResult[DenvObservation]:
        obs = dict(payload.get("observation", {}))
        obs["done"] = payload.get("done", False)
        obs["reward"] = payload.get("reward")
        return StepResult(
            observation=DenvObservation(**obs),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )

    def _parse_state(self, payload: Dict) -> State:
        return State(**payload)
"#;

const INIT: &str = r#""""__PKG__: denv version __VERSION__ of project __PROJECT__ as an OpenEnv environment."""

from .client import DenvVersionEnv
from .models import DenvAction, DenvObservation

__all__ = ["DenvAction", "DenvObservation", "DenvVersionEnv"]
"#;

const ENVIRONMENT: &str = r#""""The __PKG__ environment: every ``reset`` forks denv version __VERSION__ (project
__PROJECT__) through denv's REST API, ``step`` runs a command in the fork's agent service
(__AGENT__) or grades the fork with ``denv verify``, ``close`` destroys the fork.

Written by ``denv export --openenv``. Needs ``DENV_API_KEY`` (and ``DENV_SERVER``,
default ``http://localhost:8080``) in the server's environment.
"""

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import DenvAction, DenvObservation
except ImportError:
    from models import DenvAction, DenvObservation

PROJECT = __PROJECT_LIT__
VERSION = __VERSION_LIT__
AGENT_SERVICE = __AGENT_LIT__
#: Task name -> instruction (the project's tasks; the first is the default).
TASKS = __TASKS__
#: A fork nobody closes is destroyed this long after its reset.
TTL_SEC = int(os.environ.get("DENV_EPISODE_TTL_SEC", "7200"))
FINAL = ("succeeded", "failed", "rolled_back")


class DenvError(RuntimeError):
    """A denv call failed; the message names the call and the server's answer."""


def _call(method: str, path: str, body: Optional[dict] = None, timeout: float = 900) -> dict:
    key = os.environ.get("DENV_API_KEY")
    if not key:
        raise DenvError(f"DENV_API_KEY is not set: the environment forks denv version {VERSION} with it")
    server = os.environ.get("DENV_SERVER", "http://localhost:8080").rstrip("/")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        server + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raise DenvError(f"denv {e.code} on {method} {path}: {e.read().decode(errors='replace').strip()}") from None
    except urllib.error.URLError as e:
        raise DenvError(f"cannot reach denv at {server}: {e.reason}") from None
    return json.loads(raw) if raw else {}


class DenvVersionEnvironment(Environment):
    """One episode = one fork of the version."""

    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.env_id: Optional[str] = None
        self.task = next(iter(TASKS), "")

    def _destroy(self) -> None:
        if self.env_id:
            env, self.env_id = self.env_id, None
            try:
                _call("DELETE", f"/v1/envs/{env}")
            except DenvError:
                pass  # its TTL ends it

    def _obs(self, **kw: Any) -> DenvObservation:
        return DenvObservation(env_id=self.env_id or "", task=self.task, **kw)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> DenvObservation:
        """A new fork of the version (data included); ``task=<name>`` picks the task."""
        self._destroy()
        task = kwargs.get("task")
        if task is not None:
            if task not in TASKS:
                raise DenvError(f"no task {task!r}; tasks: {', '.join(TASKS)}")
            self.task = task
        r = _call("POST", "/v1/sandboxes", {"from_version": VERSION, "ttl_sec": TTL_SEC})
        self.env_id = r["environment"]["ID"]
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0, env_id=self.env_id, version=VERSION)
        return self._obs(instruction=TASKS.get(self.task, ""), done=False, reward=0.0, metadata={"version": VERSION})

    def step(self, action: DenvAction, timeout_s: Optional[float] = None, **kwargs: Any) -> DenvObservation:  # type: ignore[override]
        if not self.env_id:
            raise DenvError("reset first: there is no fork for this episode")
        self._state.step_count += 1
        if action.verify:
            r = _call("POST", f"/v1/envs/{self.env_id}/verify", {"resume": True})
            dep = r["deployment"]
            deadline = time.monotonic() + 1800
            while dep["Status"] not in FINAL and time.monotonic() < deadline:
                time.sleep(0.5)
                r = _call("GET", f"/v1/deployments/{dep['ID']}")
                dep = r["deployment"]
            verdict = [p for p in r.get("phases") or [] if p.get("Name") == "verdict"]
            ev = (verdict[-1].get("Evidence") if verdict else None) or {}
            reward = float(ev.get("reward", 0.0)) if dep["Status"] == "succeeded" else 0.0
            return self._obs(
                done=True,
                reward=reward,
                metadata={"verdict": ev, "deployment": dep["ID"], "status": dep["Status"], "error": dep.get("Error", "")},
            )
        if not action.command:
            raise DenvError("an action needs a command (argv) or verify=True")
        body: dict = {"service": AGENT_SERVICE, "cmd": list(action.command)}
        if action.timeout_sec:
            body["timeout_sec"] = int(action.timeout_sec)
        r = _call("POST", f"/v1/envs/{self.env_id}/exec", body)
        return self._obs(
            stdout=r.get("stdout", ""),
            stderr=r.get("stderr", ""),
            exit_code=r.get("exit_code"),
            done=False,
            reward=0.0,
        )

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        """Destroys the episode's fork."""
        self._destroy()
"#;

const APP: &str = r#""""FastAPI app of the __PKG__ environment (reset, step, state, schema, WebSocket)."""

from openenv.core.env_server.http_server import create_app

try:
    from ..models import DenvAction, DenvObservation
    from .denv_environment import DenvVersionEnvironment
except ImportError:
    from models import DenvAction, DenvObservation
    from server.denv_environment import DenvVersionEnvironment

app = create_app(
    DenvVersionEnvironment,
    DenvAction,
    DenvObservation,
    env_name=__PKG_LIT__,
    max_concurrent_envs=8,
)


def main(host: str = "0.0.0.0", port: int = 8000) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port)


if __name__ == "__main__":
    main()
"#;

/// The files of the package under `out_dir/<package>/` (see the module doc): the
/// version's agent service image id is the Dockerfile's `FROM`, its tasks' instructions
/// are `TASKS`. Errors: no agent service, no pinned image id, no verifier.
pub fn export(
    project: &str,
    version: &str,
    spec: &denv_compose::Spec,
    tasks: &[Task],
    out_dir: &Path,
) -> Result<Vec<OutFile>> {
    let agent = spec
        .agent
        .as_ref()
        .map(|a| a.service.clone())
        .ok_or_else(|| {
            anyhow!("the version has no x-denv.agent.service: the environment's actions run there")
        })?;
    let svc = spec
        .service(&agent)
        .ok_or_else(|| anyhow!("the version's agent service {agent} is not among its services"))?;
    if svc.image_id.is_empty() {
        bail!("service {agent} of the version has no pinned image id (its first deploy did not finish?)");
    }
    if spec.verifier.is_none() {
        bail!("the version has no x-denv.verifier: the environment's reward is the verifier's");
    }
    let pkg = package_name(project);
    let mut task_map = serde_json::Map::new();
    for t in tasks {
        task_map.insert(
            t.name.clone(),
            serde_json::Value::String(t.instruction.clone()),
        );
    }
    let tasks_lit = serde_json::to_string_pretty(&serde_json::Value::Object(task_map))?;
    let fill = |t: &str| {
        t.replace("__PKG_LIT__", &py(&pkg))
            .replace("__PROJECT_LIT__", &py(project))
            .replace("__VERSION_LIT__", &py(version))
            .replace("__AGENT_LIT__", &py(&agent))
            .replace("__TASKS__", &tasks_lit)
            .replace("__PKG__", &pkg)
            .replace("__PROJECT__", project)
            .replace("__VERSION__", version)
            .replace("__AGENT__", &agent)
    };
    let dir = out_dir.join(&pkg);
    let user = if svc.user.is_empty() {
        "1000:1000".to_string()
    } else {
        svc.user.clone()
    };
    let dockerfile = format!(
        "# Written by `denv export --openenv` from {project}@{version}.\n\
         # The base is the version's agent service image ({agent}), pinned by id: the server\n\
         # runs next to the agent's own tools. Each episode's world is a denv fork of the\n\
         # version (reset), not this container. The image needs python3 and pip.\n\
         FROM {id}\n\
         USER 0:0\n\
         WORKDIR /app/env\n\
         COPY . /app/env\n\
         RUN python3 -m pip install --no-cache-dir -r server/requirements.txt\n\
         ENV PYTHONPATH=/app/env\n\
         USER {user}\n\
         EXPOSE 8000\n\
         CMD [\"python3\", \"-m\", \"uvicorn\", \"server.app:app\", \"--host\", \"0.0.0.0\", \"--port\", \"8000\"]\n",
        id = svc.image_id
    );
    let yaml = format!(
        "spec_version: 1\nname: {pkg}\ntype: space\nruntime: fastapi\napp: server.app:app\nport: 8000\n"
    );
    let pyproject = format!(
        "[build-system]\nrequires = [\"setuptools>=45\", \"wheel\"]\nbuild-backend = \"setuptools.build_meta\"\n\n\
         [project]\nname = \"{name}\"\nversion = \"0.1.0\"\ndescription = \"denv version {version} of project {project} as an OpenEnv environment\"\n\
         requires-python = \">=3.10\"\ndependencies = [\"openenv-core>=0.3.0\"]\n\n\
         [project.scripts]\nserver = \"{pkg}.server.app:main\"\n\n\
         [tool.setuptools]\ninclude-package-data = true\npackages = [\"{pkg}\", \"{pkg}.server\"]\npackage-dir = {{ \"{pkg}\" = \".\", \"{pkg}.server\" = \"server\" }}\n",
        name = pkg.replace('_', "-")
    );
    let readme = format!(
        "# {pkg}\n\nVersion `{version}` of the denv project `{project}` as an OpenEnv environment,\n\
         written by `denv export --openenv`.\n\n\
         - `reset()` forks the version through denv (`POST /v1/sandboxes {{from_version}}`): every\n  episode starts from the version's snapshot, data included. `reset(task=<name>)` picks a task.\n\
         - `step(DenvAction(command=[...]))` runs the argv in the fork's agent service `{agent}`\n  and returns `stdout`, `stderr`, `exit_code`.\n\
         - `step(DenvAction(verify=True))` grades the fork with its verifier (`denv verify`) and\n  ends the episode with the verifier's reward.\n\
         - `close()` destroys the fork (a fork nobody closes ends after `DENV_EPISODE_TTL_SEC`, 2 h).\n\n\
         The server reads `DENV_SERVER` and `DENV_API_KEY` from its environment. Run it with\n\
         `uvicorn server.app:app --port 8000` in this directory, or build `server/Dockerfile`\n\
         (`docker build -f server/Dockerfile .`). Use the WebSocket client (`DenvVersionEnv`):\n\
         OpenEnv's plain HTTP `/reset` makes a new environment per request and closes it.\n"
    );
    Ok(vec![
        OutFile::new(dir.join("__init__.py"), fill(INIT)),
        OutFile::new(dir.join("models.py"), fill(MODELS)),
        OutFile::new(dir.join("client.py"), fill(CLIENT)),
        OutFile::new(dir.join("server/__init__.py"), ""),
        OutFile::new(dir.join("server/app.py"), fill(APP)),
        OutFile::new(dir.join("server/denv_environment.py"), fill(ENVIRONMENT)),
        OutFile::new(dir.join("server/requirements.txt"), "openenv-core==0.3.0\n"),
        OutFile::new(dir.join("server/Dockerfile"), dockerfile),
        OutFile::new(dir.join("openenv.yaml"), yaml),
        OutFile::new(dir.join("pyproject.toml"), pyproject),
        OutFile::new(dir.join("README.md"), readme),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_are_python_identifiers() {
        assert_eq!(package_name("ops-world"), "ops_world_env");
        assert_eq!(package_name("9lives"), "env_9lives_env");
        assert_eq!(package_name("A.b"), "a_b_env");
    }

    #[test]
    fn the_package_forks_the_version_and_builds_on_the_pinned_image() {
        let mut spec = denv_compose::parse("x-denv:\n  agent: {service: box}\n  verifier: {service: box, command: [/g]}\nservices:\n  box: {image: busybox:1.36, user: \"1000:1000\"}\n").unwrap();
        spec.services[0].image_id = "sha256:abc".into();
        let tasks = [Task {
            name: "t\"1".into(),
            instruction: "say \"hi\"\n".into(),
            verifier: Default::default(),
            solution: None,
        }];
        let f = export("ops-world", "ver_1", &spec, &tasks, Path::new("/o")).unwrap();
        let get = |s: &str| {
            std::str::from_utf8(&f.iter().find(|f| f.path.ends_with(s)).unwrap().bytes)
                .unwrap()
                .to_string()
        };
        assert!(get("server/Dockerfile").contains("\nFROM sha256:abc\n"));
        assert!(get("server/Dockerfile").contains("\nUSER 1000:1000\n"));
        let env = get("server/denv_environment.py");
        assert!(env.contains("VERSION = \"ver_1\"\n"));
        assert!(env.contains("AGENT_SERVICE = \"box\"\n"));
        assert!(env.contains("\"t\\\"1\": \"say \\\"hi\\\"\\n\""), "{env}");
        for f in &f {
            let t = std::str::from_utf8(&f.bytes).unwrap();
            assert!(
                !t.split("__")
                    .skip(1)
                    .any(|p| p.starts_with(|c: char| c.is_ascii_uppercase())),
                "a placeholder left in {}: {t}",
                f.path.display()
            );
        }
        assert!(get("server/app.py").contains("env_name=\"ops_world_env\""));
        assert!(f[0].path.starts_with("/o/ops_world_env"));
        spec.verifier = None;
        let e = export("p", "v", &spec, &tasks, Path::new("/o"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no x-denv.verifier"), "{e}");
    }
}
