"""The launcher's pid file: written at start, refused while held, stale files replaced,
removed only by the process it names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodepool_k8s.runtime import pidfile


def test_claim_writes_this_process_and_release_removes_it(tmp_path: Path) -> None:
    path = tmp_path / "launcher.pid"
    pidfile.claim(str(path))
    assert path.read_text() == f"{os.getpid()}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["launcher.pid"]  # no temporary left
    pidfile.release(str(path))
    assert not path.exists()


def test_a_live_holder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "launcher.pid"
    path.write_text(f"{os.getppid()}\n")  # the process that started pytest: alive
    with pytest.raises(pidfile.PidFileError, match=f"process {os.getppid()} is running"):
        pidfile.claim(str(path))
    assert path.read_text() == f"{os.getppid()}\n"
    pidfile.release(str(path))  # not ours: left alone
    assert path.exists()


@pytest.mark.parametrize("content", ["garbage\n", "", "-5\n"])
def test_unusable_content_is_replaced(tmp_path: Path, content: str) -> None:
    path = tmp_path / "launcher.pid"
    path.write_text(content)
    pidfile.claim(str(path))
    assert path.read_text() == f"{os.getpid()}\n"


def test_a_stale_pid_is_replaced(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    path = tmp_path / "launcher.pid"
    path.write_text(done.stdout)  # that process has exited and been reaped
    pidfile.claim(str(path))
    assert path.read_text() == f"{os.getpid()}\n"


def test_an_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(pidfile.PidFileError, match="cannot write the pid file"):
        pidfile.claim(str(tmp_path / "missing-dir" / "launcher.pid"))
