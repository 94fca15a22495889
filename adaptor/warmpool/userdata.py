"""The user data a warm VM boots with: its apf.json carries the images to pull, nothing else.

The request travels as the `peerpods-warm` key of `/run/peerpod/apf.json`
(`adaptor.podvm.warmrequest` owns the format), written from the cloud-config's `write_files`:
the one file every pod VM image writes, by CAA's `process-user-data` (which writes only its
allow-listed files and runs nothing) as by cloud-init. In the VM, `peerpods podvm warm` (the
recipe's `peerpods-podvm-warm.service`, before kata-agent) finds the key, pulls the images onto
the image's persistent `peerpods-images` partition, cleans cloud-init's state where cloud-init
is installed (so the adoption's boot is a first boot and writes the pod's files) and powers off.

The power-off is the VM's report of readiness: the keeper waits for the VM to be stopped, so no
address of the VM is ever dialled and nothing listens on it while it warms.

The document is the one `adaptor.planning.userdata` writes for every VM: `write_files` with
`path` and `content` alone, as CAA's process-user-data reads it strictly. So nothing runs from
the user data itself: an image without peerpods' warm unit never powers off, and the pool
deletes its VM at --warm-pool-ready-timeout.
"""

from __future__ import annotations

from collections.abc import Sequence

from adaptor.planning.userdata import json_content, write_files_document
from adaptor.podvm.warmrequest import APF_PATH, apf_document


def warm_user_data(images: Sequence[str]) -> str:
    """The cloud-config of a warm VM that pre-pulls `images`."""
    return write_files_document([(APF_PATH, json_content(apf_document(images)))])
