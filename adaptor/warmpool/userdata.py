"""The user data a warm VM boots with: pull the pool's images, forget this boot, power off.

The power-off is the VM's report of readiness: the keeper waits for the VM to be stopped, so
no address of the VM is ever dialled and nothing listens on it while it warms. Before powering
off, cloud-init's state is cleaned (`cloud-init clean`), so the next boot, the adoption's, is
a first boot again: cloud-init reads the pod's user data, which the adoption wrote while the VM
was stopped, and writes its files as for a VM launched for the pod. The images are pulled by
the pod VM image's own hook (`/usr/local/bin/peerpods-warm-pull`, which knows whether the
image's runtime pulls in the guest or through nydus), onto the root volume that survives the
stop; an image without the hook still warms (boot, driver, agent) and pulls nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml

IMAGES_PATH = "/etc/peerpods/warm-images"
PULL_HOOK = "/usr/local/bin/peerpods-warm-pull"


def warm_user_data(images: Sequence[str]) -> str:
    """The cloud-config of a warm VM that pre-pulls `images`."""
    script = (
        f"if [ -x {PULL_HOOK} ] && [ -s {IMAGES_PATH} ]; then {PULL_HOOK} {IMAGES_PATH}; fi; "
        "cloud-init clean --logs; sync; poweroff"
    )
    document = {
        "write_files": [
            {
                "path": IMAGES_PATH,
                "permissions": "0644",
                "content": "".join(f"{image}\n" for image in images),
            }
        ],
        "runcmd": [["sh", "-c", script]],
    }
    return "#cloud-config\n" + yaml.safe_dump(document, sort_keys=False, width=10_000)
