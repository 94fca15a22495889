"""What a warm VM's user data asks of the pod VM, read as the VM reads it: the cloud-config's
apf.json written to a file and its warm request read back by `adaptor.podvm.warmrequest`."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from adaptor.podvm.warmrequest import APF_PATH, WarmRequest, read_request


def warm_request(user_data: str) -> WarmRequest:
    """The warm request in a warm VM's user data (AssertionError when it has none)."""
    assert user_data.startswith("#cloud-config\n")
    document = yaml.safe_load(user_data)
    files = {entry["path"]: entry["content"] for entry in document["write_files"]}
    assert set(files) == {APF_PATH}, "a warm VM is sent its apf.json alone"
    with tempfile.TemporaryDirectory() as tmp:
        apf = Path(tmp, "apf.json")
        apf.write_text(files[APF_PATH])
        request = read_request(apf)
    assert request is not None, "no peerpods-warm key in the warm VM's apf.json"
    return request
