"""The CLI's log handler writes to stderr as it is at each record: a handler that kept the stream
it was made with failed every record once that stream closed (a CLI run in-process under pytest's
capture configures logging on the captured stderr, closed at the test's end), burying later
failures under "--- Logging error --- ValueError: I/O operation on closed file" blocks."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from adaptor.cli.main import main
from adaptor.runtime import logs


@pytest.fixture(autouse=True)
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_record_after_the_configured_stream_closed_goes_to_the_current_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.configure("info", "text")
    logging.getLogger("peerpods.test").warning("before")
    assert "before" in first.getvalue()
    first.close()  # the stream the handler was made with is gone
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("peerpods.test").warning("after")
    assert "after" in second.getvalue()
    assert "Logging error" not in second.getvalue()


def test_no_handler_outlives_its_stream_after_an_in_process_cli_run(
    capsys: pytest.CaptureFixture[str], root_logger: logging.Logger
) -> None:
    assert main(["select", "--gpus", "1", "--gpu-model", "h100"]) == 0
    capsys.readouterr()
    # what pytest's capture does at the end of a test: the captured stream is closed
    for handler in root_logger.handlers:
        stream = getattr(handler, "stream", None)
        assert stream is None or stream is sys.stderr, f"{handler!r} keeps {stream!r}"
    spare = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stderr", spare)
        logging.getLogger("peerpods.test").error("later")
    assert "later" in spare.getvalue() and "Logging error" not in spare.getvalue()
