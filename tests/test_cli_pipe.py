"""A reader that stops early (`peerpods plan POD | head -1`) ends the CLI quietly: no "Broken pipe"
line, no traceback at exit, the exit status of a program killed by SIGPIPE (141). Run through a
real pipe in a child process: the writer must hit EPIPE, which an in-process capture never does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "import sys; from adaptor.cli.main import main; sys.exit(main())"]


def first_line_then_close(argv: list[str]) -> tuple[bytes, int, str]:
    child = subprocess.Popen(
        [*CLI, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline()
    child.stdout.close()  # what `head -1` does once it has its line
    err = child.stderr.read().decode()
    return line, child.wait(timeout=120), err


def test_a_reader_gone_mid_output_ends_quietly_with_sigpipes_status() -> None:
    # about 130 kB of table: more than a pipe holds, so the writer meets the closed pipe
    line, code, err = first_line_then_close(["select", "--vcpus", "1", "--limit", "5000"])
    assert line.startswith(b"selected: ")
    assert err == "", err
    assert code == 141


def test_plan_into_head_prints_no_broken_pipe() -> None:
    done = subprocess.run(
        f"{sys.executable} -c 'import sys; from adaptor.cli.main import main; sys.exit(main())' "
        "plan config/examples/gpu-pod.yaml --limit 5000 | head -1",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.startswith("pod default/cuda-vectoradd")
    assert done.stdout.count("\n") == 1
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr
