"""The environment a run records for bug-report bundles: whether the git tree was dirty, the NVIDIA driver."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from specscope.backend.session import _versions, archive_commit, git_commit, git_dirty, nvidia_driver
from specscope.tracer.export.bundle import environment
from specscope.tracer.store import TraceReader
from test_export_common import FAULT, recorded

REPO = Path(__file__).resolve().parents[2]
GIT = shutil.which("git")


def git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env=env)


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_git_dirty_in_a_temporary_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-q", "-m", "one")
    assert git_dirty(repo) == "false" and git_commit(repo) is not None
    (repo / "a.py").write_text("x = 2\n")  # a modified tracked file
    assert git_dirty(repo) == "true"
    git(repo, "commit", "-q", "-am", "two")
    assert git_dirty(repo) == "false"
    (repo / "new.py").write_text("")  # an untracked file also makes the run not reproducible from the commit
    assert git_dirty(repo) == "true"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_dirty(plain) is None and git_commit(plain) is None  # not a repository: unknown, not "clean"


def test_no_git_and_no_nvidia_smi_mean_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither git nor nvidia-smi can be found
    assert git_dirty() is None and git_commit(tmp_path) is None and nvidia_driver() is None
    # The tree's own commit is what its archive file says: nothing in a checkout, the commit in a `git archive` copy.
    assert git_commit() == archive_commit()
    v = _versions(torch.device("cpu"))
    assert "git_dirty" not in v and "nvidia_driver" not in v and v["torch"] == torch.__version__
    assert capsys.readouterr().err == ""  # quietly: no traceback, no git noise


def test_nvidia_driver_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # This CI host has no GPU, so a stand-in nvidia-smi prints what the real one prints for two GPUs.
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --query-gpu=driver_version ] && printf '570.86.15\\n570.86.15\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert nvidia_driver() == "570.86.15"
    assert "nvidia_driver" not in _versions(torch.device("cpu"))  # a CPU run names no driver
    assert _versions(torch.device("cuda"))["nvidia_driver"] == "570.86.15"
    fake.write_text("#!/bin/sh\nexit 9\n")  # nvidia-smi that fails (no driver loaded)
    assert nvidia_driver() is None


def test_a_recorded_run_carries_the_dirty_flag(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A real CPU run records versions['git_dirty'] for its checkout, and bundles no longer report it missing."""
    path = recorded(tmp_path_factory, "fault", FAULT)
    with TraceReader(path) as r:
        v = r.run.versions
        env = environment(r)
    want = git_dirty(REPO / "backend")
    assert v.get("git_dirty") == want
    if want is not None:
        assert env["git_dirty"] == want and not any("dirty" in m for m in env["not_recorded"])
    assert env["nvidia_driver"] is None and not any("driver" in m for m in env["not_recorded"])  # a CPU run


def _archive_copy(tmp_path: Path) -> tuple[Path, Path, str]:
    """A git repository holding a copy of backend/ (with the archive file's export-subst) and a `git archive` of it
    unpacked beside: (repository, unpacked copy, commit)."""
    import specscope.backend.session as session

    repo = tmp_path / "repo"
    shutil.copytree(Path(session.__file__).parent, repo / "backend", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".gitattributes").write_text("backend/archive_commit.txt export-subst\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "x")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    out = tmp_path / "copy"
    out.mkdir()
    tar = subprocess.run(["git", "archive", "HEAD"], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", str(out)], input=tar, check=True)
    return repo, out, head


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_a_git_archive_copy_names_its_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree made by `git archive` (how GPU hosts get it) has no .git: the commit comes from the file git filled."""
    import specscope.backend.session as session

    repo, out, head = _archive_copy(tmp_path)
    monkeypatch.setattr(session, "_SOURCE_DIR", out / "backend")
    assert session.archive_commit() == head and session.git_commit(out / "backend") == head
    monkeypatch.setattr(session, "_SOURCE_DIR", repo / "backend")  # a checkout: the file is unfilled, git answers
    assert session.archive_commit() is None and git_commit(repo / "backend") == head


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_from_a_git_archive_copy_other_folders_have_no_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a `git archive` copy (its archive file filled, no .git), the copy's commit describes the copy only:
    a folder elsewhere that is no repository has none, with or without git, as in a checkout."""
    import specscope.backend.session as session

    _, out, head = _archive_copy(tmp_path)
    monkeypatch.setattr(session, "_SOURCE_DIR", out / "backend")  # this process now runs from the copy
    plain = tmp_path / "plain"
    plain.mkdir()
    assert session.git_commit(plain) is None and session.git_dirty(plain) is None
    assert session.git_commit() == head and session.git_commit(out) == head  # the copy, and its top folder
    monkeypatch.setenv("PATH", str(plain))  # no git at all
    assert session.git_commit(plain) is None and session.git_commit(out / "backend") == head
    assert session.git_commit(plain, archive_file=out / "backend" / "archive_commit.txt") == head  # named: used
