"""A region without a bundled snapshot names the way to one, with flags that exist on the
commands it names (the webhook has no --live; it takes --catalog-dir)."""

from __future__ import annotations

import re

import pytest

from adaptor.cli.main import build_parser
from providers.core.errors import CatalogError
from providers.core.snapshots import load_catalog


def test_the_hint_names_flags_that_exist(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CatalogError) as missing:
        load_catalog("aws", "ap-south-2")
    message = str(missing.value)
    assert "peerpods catalog refresh --provider aws --region ap-south-2 --out DIR" in message
    parser = build_parser()
    refresh = parser.parse_args(
        ["catalog", "refresh", "--provider", "aws", "--region", "ap-south-2", "--out", "x"]
    )
    assert refresh.region == "ap-south-2"
    for command in ("webhook", "serve", "select"):
        with pytest.raises(SystemExit) as helped:
            parser.parse_args([command, "--help"])
        assert helped.value.code == 0
        assert "--catalog-dir" in capsys.readouterr().out, command
    with pytest.raises(SystemExit):
        parser.parse_args(["select", "--help"])
    assert re.search(r"--live\b", capsys.readouterr().out)
