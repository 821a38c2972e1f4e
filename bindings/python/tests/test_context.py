"""Build contexts: ``denv.client.pack_context``/``build_contexts`` honour ``.dockerignore``
and give byte for byte the tar ``denv deploy`` sends (the CLI's packer, run through the
``pack_context`` example of ``crates/denv-cli``), so both clients hit the same build
cache on the host."""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from denv.client import build_contexts, pack_context

ROOT = Path(__file__).resolve().parents[3]


def _names(tar_bytes: bytes) -> list[str]:
    return [m.name for m in tarfile.open(fileobj=io.BytesIO(tar_bytes))]


def _write(root: Path, rel: str, data: str = "x", mode: int | None = None) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data)
    if mode is not None:
        p.chmod(mode)


def _context(root: Path) -> None:
    """A context with things docker would not send, exceptions, a link and odd modes."""
    _write(
        root,
        ".dockerignore",
        "# what the image needs, nothing else\n.git\n**/node_modules\n*.log\n!keep.log\n"
        "data\n!data/schema/*.sql\ndocker\n",
    )
    _write(root, "docker/app.Dockerfile", "FROM busybox:1.36\nCOPY . /app\n")
    _write(root, "docker/worker.Dockerfile", "FROM busybox:1.36\n")
    _write(root, "docker/secret.env", "TOKEN=x")
    _write(root, ".git/HEAD", "ref: refs/heads/main\n")
    _write(root, "web/node_modules/m/index.js", "js")
    _write(root, "app.log", "log")
    _write(root, "keep.log", "keep")
    _write(root, "data/dump.bin", "big")
    _write(root, "data/schema/init.sql", "create table t();")
    _write(root, "src/run.sh", "#!/bin/sh\n", mode=0o750)
    _write(root, "src-old/x", "x")
    os.symlink("../src/run.sh", root / "run")


COMPOSE = """services:
  app:
    build: {context: ./ctx, dockerfile: docker/app.Dockerfile}
  worker:
    build: {context: ./ctx, dockerfile: ./docker/worker.Dockerfile}
"""


def test_dockerignore_is_honoured(tmp_path: Path) -> None:
    _context(tmp_path)
    t = pack_context(tmp_path, ["docker/app.Dockerfile", "docker/worker.Dockerfile"])
    assert _names(t) == [
        ".dockerignore",
        "data",
        "data/schema",
        "data/schema/init.sql",
        "docker",
        "docker/app.Dockerfile",
        "docker/worker.Dockerfile",
        "keep.log",
        "run",
        "src",
        "src-old",
        "src-old/x",
        "src/run.sh",
        "web",
    ]
    members = {m.name: m for m in tarfile.open(fileobj=io.BytesIO(t))}
    assert members["src/run.sh"].mode == 0o750
    assert members["run"].issym() and members["run"].linkname == "../src/run.sh"
    # One Dockerfile given as a string keeps only that one.
    assert "docker/worker.Dockerfile" not in _names(pack_context(tmp_path, "docker/app.Dockerfile"))


def test_an_ignored_large_file_passes_and_errors_keep_their_types(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    with open(tmp_path / "big.bin", "wb") as f:
        f.truncate(40 * 1024 * 1024)
    with pytest.raises(ValueError, match=r"larger than 32 MiB \(stopped at big.bin\)"):
        pack_context(tmp_path)
    (tmp_path / ".dockerignore").write_text("*.bin\n")
    assert _names(pack_context(tmp_path)) == [".dockerignore", "Dockerfile"]
    (tmp_path / ".dockerignore").write_text("*.bin\n[oops\n")
    with pytest.raises(ValueError, match=r'\.dockerignore line 2: pattern "\[oops" does not parse'):
        pack_context(tmp_path)
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        pack_context(tmp_path / "Dockerfile")


def test_the_bytes_are_the_clis(tmp_path: Path) -> None:
    cargo = shutil.which("cargo")
    if cargo is None or not (ROOT / "crates" / "denv-cli").is_dir():
        pytest.skip("needs cargo and the denv source tree to run the CLI's packer")
    _context(tmp_path / "ctx")
    (tmp_path / "compose.yaml").write_text(COMPOSE)
    import yaml

    ours = build_contexts(yaml.safe_load(COMPOSE), tmp_path)
    assert list(ours) == ["./ctx"]
    cli = subprocess.run(
        [cargo, "run", "-q", "-p", "denv-cli", "--example", "pack_context", "--",
         str(tmp_path / "compose.yaml"), "./ctx"],
        cwd=ROOT,
        capture_output=True,
        timeout=1200,
    )
    assert cli.returncode == 0, cli.stderr.decode(errors="replace")
    assert base64.b64decode(ours["./ctx"]) == cli.stdout
    assert "docker/secret.env" not in _names(cli.stdout)
