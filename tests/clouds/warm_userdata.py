"""What a warm VM's user data asks of the pod VM, read as the VM reads it: the cloud-config's
apf.json (as CAA's strict process-user-data reads it) written to a file and its warm request read
back by `adaptor.podvm.warmrequest`."""

from __future__ import annotations

import tempfile
from pathlib import Path

from adaptor.podvm.warmrequest import APF_PATH, WarmRequest, read_request
from tests.clouds.caa_userdata import caa_files


def warm_request(user_data: str) -> WarmRequest:
    """The warm request in a warm VM's user data (AssertionError when it has none)."""
    assert user_data.startswith("#cloud-config\n")
    files = caa_files(user_data)  # what CAA's process-user-data reads, as cloud-init does
    assert set(files) == {APF_PATH}, "a warm VM is sent its apf.json alone"
    with tempfile.TemporaryDirectory() as tmp:
        apf = Path(tmp, "apf.json")
        apf.write_text(files[APF_PATH])
        request = read_request(apf)
    assert request is not None, "no peerpods-warm key in the warm VM's apf.json"
    return request
