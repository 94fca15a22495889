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

`runcmd` is for cloud-init images without peerpods' warm unit only: they clean cloud-init's
state and power off without pulling (an image with the unit leaves it all to the unit, which
waits for cloud-init's final stage before it cleans). CAA's image ignores `runcmd`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import yaml

from adaptor.podvm.warmrequest import APF_PATH, apf_document

WARM_UNIT = "peerpods-podvm-warm.service"
# cloud-init images without the warm unit still power off (warm without a pull)
FALLBACK = (
    f"systemctl is-enabled --quiet {WARM_UNIT} 2>/dev/null || "
    "{ cloud-init clean --logs; sync; poweroff; }"
)


def warm_user_data(images: Sequence[str]) -> str:
    """The cloud-config of a warm VM that pre-pulls `images`."""
    document = {
        "write_files": [
            {
                "path": APF_PATH,
                "permissions": "0600",
                "content": json.dumps(apf_document(images), separators=(",", ":"), sort_keys=True),
            }
        ],
        "runcmd": [["sh", "-c", FALLBACK]],
    }
    return "#cloud-config\n" + yaml.safe_dump(document, sort_keys=False, width=10_000)
