"""The `#cloud-config` written directly parses, in the pod VM's YAML parser, to exactly the
document yaml.safe_dump would have written, whatever the file contents hold."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from adaptor.planning import userdata
from adaptor.planning.userdata import APF_PATH, GpuSetup, PodVMConfig, render

AWKWARD = [
    "",
    " leading and trailing ",
    "it's 'quoted' and \"double\"",
    "back\\slash \\n not a newline",
    "# not a comment: - [x] {y} & *z ! | > % @ `",
    "yes",
    "null",
    "0600",
    "~",
    "-",
    "'",
]


def _through_safe_dump(config: PodVMConfig, monkeypatch: pytest.MonkeyPatch) -> str:
    """The user data as yaml.safe_dump writes it (the direct writer turned off)."""
    with monkeypatch.context() as patch:
        patch.setattr(userdata, "_SINGLE_QUOTABLE", re.compile(r"(?!)"))
        return render(config)


@pytest.mark.parametrize("content", AWKWARD)
def test_direct_rendering_parses_as_written(content: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = PodVMConfig(
        pod_namespace="ns",
        pod_name=content,
        tls_server_key="-----BEGIN PRIVATE KEY-----\nAB+/=\n-----END PRIVATE KEY-----\n",
        gpu=GpuSetup(model="a100"),
        extra_files=(("/run/peerpod/extra", content),),
    )
    text = render(config)
    assert text.startswith("#cloud-config\nwrite_files:\n- path: ")
    parsed = yaml.safe_load(text)
    files = {f["path"]: f for f in parsed["write_files"]}
    assert files["/run/peerpod/extra"] == {"path": "/run/peerpod/extra", "content": content}
    assert json.loads(files[APF_PATH]["content"]) == config.apf_json()
    dumped = _through_safe_dump(config, monkeypatch)
    assert dumped != text
    assert parsed == yaml.safe_load(dumped)


@pytest.mark.parametrize("content", ["two\nlines", "tab\there", "caf\u00e9", "\U0001f600", "\x85"])
def test_contents_outside_printable_ascii_still_round_trip(content: str) -> None:
    config = PodVMConfig(
        pod_namespace="ns", pod_name="p", extra_files=(("/run/peerpod/extra", content),)
    )
    parsed = yaml.safe_load(render(config))
    [_apf, extra] = parsed["write_files"]
    assert extra["content"] == content
