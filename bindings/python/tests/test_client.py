"""Unit tests of the pure-Python client layer that need no server.

``shell_command`` argvs are executed for real with the host's ``sh``/``bash``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import denv
from denv.client import (
    ROLLOUT_TTL_SEC,
    Client,
    _sandbox_of,
    _extract_contents,
    _first_regular_file,
    _tar_of_dir,
    _tar_of_file,
    _log_line,
    _verdict_of,
    _whole_numbers,
    shell_command,
    ttl_arg,
)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, **kw)


# ---------------------------------------------------------------- shell_command


def test_shell_command_exports_env_and_applies_cwd(tmp_path: Path) -> None:
    argv = shell_command('echo "$FOO|$BAR"; pwd', cwd=str(tmp_path), env={"FOO": "a b'c", "BAR": "$HOME"})
    assert argv[:2] == ["sh", "-c"]
    out = run(argv)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["a b'c|$HOME", str(tmp_path)]


def test_shell_command_prefers_bash() -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash on this host")
    out = run(shell_command('echo "${BASH_VERSION:+bash}"'))
    assert out.stdout.strip() == "bash"


def test_shell_command_falls_back_to_sh_without_bash(tmp_path: Path) -> None:
    # A PATH where only sh exists: the selector must pick sh.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(shutil.which("sh") or "/bin/sh", bindir / "sh")
    os.symlink(shutil.which("echo") or "/bin/echo", bindir / "echo")
    argv = shell_command('echo "bash=${BASH_VERSION:-none}"')
    out = run([str(bindir / "sh")] + argv[1:], env={"PATH": str(bindir)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "bash=none"


def test_shell_command_exit_code_and_multiline_script() -> None:
    out = run(shell_command("x=3\nif [ $x -eq 3 ]; then exit 7; fi\nexit 0"))
    assert out.returncode == 7


def test_shell_command_missing_cwd_fails() -> None:
    out = run(shell_command("echo should-not-run", cwd="/definitely/not/here"))
    assert out.returncode != 0
    assert "should-not-run" not in out.stdout


def test_shell_command_takes_no_user_and_never_uses_su() -> None:
    # The user is Client.exec's (the engine's exec user); su asked for a password on
    # images whose default user is not root, and ran "root" as that user.
    for user in ("nobody", 1000, "root", 0):
        with pytest.raises(TypeError, match="Client.exec"):
            shell_command("true", user=user)
    argv = shell_command("id -un", cwd="/tmp", env={"V": "v1"})
    assert argv[:2] == ["sh", "-c"] and "su " not in argv[2] and "getent" not in argv[2]


def test_shell_command_rejects_bad_env_names() -> None:
    with pytest.raises(ValueError):
        shell_command("true", env={"A-B": "x"})


# ---------------------------------------------------------------- config and errors


def test_missing_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DENV_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="^DENV_API_KEY is not set$"):
        Client()


def test_server_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENV_API_KEY", "dak_test")
    monkeypatch.delenv("DENV_SERVER", raising=False)
    c = Client()
    assert c.server == "http://localhost:8080"
    assert c.timeout == 900.0
    monkeypatch.setenv("DENV_SERVER", "http://127.0.0.1:9/")
    assert Client().server == "http://127.0.0.1:9"
    assert Client(server="http://x:1", api_key="dak_2", timeout=5).api_key == "dak_2"


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"image": "busybox:1.36", "from_version": "ver_1"}, {"image": ""}],
)
def test_sandbox_needs_exactly_one_source(kwargs: dict) -> None:
    c = Client(server="http://127.0.0.1:9", api_key="dak_x")
    with pytest.raises(ValueError):
        c.sandbox(**kwargs)
    # nothing was connected
    assert c._native_client is None


@pytest.mark.parametrize("ttl", [0, -5, 0.5, "30m", True])
def test_sandbox_refuses_a_bad_ttl(ttl) -> None:
    c = Client(server="http://127.0.0.1:9", api_key="dak_x")
    with pytest.raises(ValueError, match="ttl_sec must be a number of seconds >= 1"):
        c.sandbox(image="busybox:1.36", ttl_sec=ttl)
    assert c._native_client is None


def test_pool_needs_a_plain_fork() -> None:
    c = Client(server="http://127.0.0.1:9", api_key="dak_x")
    with pytest.raises(ValueError, match="pool needs live=False"):
        c.fork("env_1", pool=2)
    assert c._native_client is None


def test_ttl_arg_of_the_adapters() -> None:
    assert ttl_arg(None) is None
    for off in (0, "0", "", "none", "None"):
        assert ttl_arg(off) is None
    assert ttl_arg("3600") == 3600.0
    assert ttl_arg(90) == 90.0
    for bad in ("soon", -1, "0.5"):
        with pytest.raises(ValueError):
            ttl_arg(bad)
    assert ROLLOUT_TTL_SEC == 7200


def test_sandbox_of_reads_expires_at() -> None:
    s = _sandbox_of({"ID": "env_1", "Name": "n", "Status": "healthy", "ExpiresAt": "2026-12-01T16:00:00.000Z"})
    assert s.expires_at == "2026-12-01T16:00:00.000Z"
    assert _sandbox_of({"ID": "env_1"}).expires_at == ""


def test_exec_refuses_a_string_command() -> None:
    c = Client(server="http://127.0.0.1:9", api_key="dak_x")
    with pytest.raises(TypeError):
        c.exec("env_1", "main", "echo hi")  # type: ignore[arg-type]


def test_unreachable_server_raises_runtime_error() -> None:
    pytest.importorskip("denv._native")
    # Port 9 (discard) on loopback: nothing listens.
    c = Client(server="http://127.0.0.1:9", api_key="dak_x", timeout=5)
    with pytest.raises(RuntimeError, match=r"^denv \d+: "):
        c.current_version("env_1")


def test_ca_file_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENV_API_KEY", "dak_test")
    monkeypatch.delenv("DENV_CA_FILE", raising=False)
    assert Client().ca_file is None
    monkeypatch.setenv("DENV_CA_FILE", "/etc/denv/ca.pem")
    assert Client().ca_file == "/etc/denv/ca.pem"
    assert Client(ca_file=Path("/x/ca.pem")).ca_file == "/x/ca.pem"
    assert denv.AsyncClient(ca_file="/y/ca.pem").sync.ca_file == "/y/ca.pem"


def test_an_unreadable_ca_file_is_a_400_naming_it() -> None:
    pytest.importorskip("denv._native")
    c = Client(server="https://127.0.0.1:9", api_key="dak_x", timeout=5, ca_file="/nonexistent/ca.pem")
    with pytest.raises(denv.DenvError) as e:
        c.current_version("env_1")
    assert e.value.status == 400
    assert str(e.value) == "denv 400: ca file /nonexistent/ca.pem: no such file or directory (os error 2)"


def test_public_names() -> None:
    assert denv.__version__ == "0.1.0"
    for name in ("Client", "Sandbox", "ExecResult", "Verdict", "AsyncClient", "DenvError"):
        assert hasattr(denv, name)
    assert issubclass(denv.DenvError, RuntimeError)
    fields = lambda cls: list(cls.__dataclass_fields__)  # noqa: E731
    assert fields(denv.Sandbox) == ["id", "name", "status", "endpoints", "raw", "expires_at"]
    assert fields(denv.ExecResult) == [
        "exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "timed_out",
    ]
    assert fields(denv.Verdict) == [
        "deployment_id", "reward", "refused", "missing", "source", "status", "evidence",
    ]


def test_log_lines_and_env_info_shapes() -> None:
    assert [f for f in denv.LogLine.__dataclass_fields__] == [
        "service", "stream", "line", "timestamp", "truncated",
    ]
    assert [f for f in denv.EnvInfo.__dataclass_fields__] == [
        "id", "name", "project_id", "project", "status", "current_version", "stage", "raw",
    ]
    l = _log_line({"service": "db", "stream": "stderr", "line": "x", "timestamp": "", "truncated": False})
    assert (l.service, l.stream, l.line, l.timestamp, l.truncated) == ("db", "stderr", "x", "", False)
    assert _log_line({"service": "db", "truncated": True}).truncated is True


def test_logs_refuses_a_negative_tail_before_any_call() -> None:
    c = Client(server="http://127.0.0.1:9", api_key="dak_x")
    with pytest.raises(ValueError, match="tail"):
        c.logs("env_1", tail=-1)


def test_logs_of_an_unreachable_server_raise() -> None:
    pytest.importorskip("denv._native")
    c = Client(server="http://127.0.0.1:9", api_key="dak_x", timeout=5)
    with pytest.raises(RuntimeError, match=r"^denv \d+: "):
        c.logs("env_1", timeout_sec=5)


# ---------------------------------------------------------------- tar helpers


def test_single_file_tar_round_trip() -> None:
    blob = _tar_of_file(b"alpha\x00\xff", "a.bin", 0o600)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        (m,) = tf.getmembers()
        assert (m.name, m.size, m.mode) == ("a.bin", 7, 0o600)
    assert _first_regular_file(blob) == b"alpha\x00\xff"


def test_first_regular_file_of_a_directory_only_archive_is_none() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
    assert _first_regular_file(buf.getvalue()) is None


def test_dir_tar_holds_contents_and_extract_strips_the_top_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.txt").write_text("B")
    blob = _tar_of_dir(src)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        assert sorted(tf.getnames()) == ["a.txt", "sub", "sub/b.txt"]

    # The server archives /x/verifier as entries under "verifier/".
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(str(src), arcname="verifier")
    out = tmp_path / "out"
    _extract_contents(buf.getvalue(), out)
    assert (out / "a.txt").read_text() == "A"
    assert (out / "sub" / "b.txt").read_text() == "B"
    assert not (out / "verifier").exists()


def test_extract_refuses_escaping_entries_and_links(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("d/ok.txt", b"ok"), ("d/../../evil.txt", b"evil")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("d/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tf.addfile(link)
    out = tmp_path / "deep" / "out"
    _extract_contents(buf.getvalue(), out)
    assert (out / "ok.txt").read_bytes() == b"ok"
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "deep" / "evil.txt").exists()
    assert not (out / "link").exists()


# ---------------------------------------------------------------- verdict


def test_sheet_numbers_come_back_whole() -> None:
    sheet = {"datasets": {"pg": {"files": 3.0, "bytes": 42.0}}, "caps": [{"cpus": 1.5}], "n": None}
    out = _whole_numbers(sheet)
    assert out == {"datasets": {"pg": {"files": 3, "bytes": 42}}, "caps": [{"cpus": 1.5}], "n": None}
    assert isinstance(out["datasets"]["pg"]["files"], int)


def test_verdict_of_evidence() -> None:
    v = _verdict_of(
        "dep_1",
        "succeeded",
        {"reward": 1, "source": "reward.txt", "exit_code": 0, "refused": [], "missing": ["/x"]},
    )
    assert (v.reward, v.source, v.missing, v.refused) == (1.0, "reward.txt", ["/x"], [])
    r = _verdict_of("dep_2", "succeeded", {"reward": 0, "refused": [{"path": "/a", "reason": "symlink"}]})
    assert (r.reward, r.refused, r.source) == (0.0, ["/a: symlink"], "refused")
    f = _verdict_of("dep_3", "failed", {"reward": None})
    assert (f.reward, f.source, f.status) == (None, "error", "failed")


def test_resources_drop_nones_and_refuse_non_mappings() -> None:
    from denv.client import _resources

    assert _resources(None) == {}
    assert _resources({"cpus": 0.5, "memory": "64m", "pids": None}) == {"cpus": 0.5, "memory": "64m"}
    with pytest.raises(ValueError, match="resources must be a mapping"):
        _resources("64m")  # type: ignore[arg-type]
