"""Pod networking: the worker side of cloud-api-adaptor's VXLAN tunnel to each pod VM.

The sandbox manager calls `PodNet.inspect` at CreateVM, `setup` once the VM has an address,
`teardown` at StopVM and `repair` at restart; the `Tunnel` each returns is stored with the
sandbox. `PodNetwork.to_dict()` is the `pod-network` section of the VM's apf.json.
"""

from adaptor.podnet._errors import BadNetns, NetnsGone, PodNetError, TunnelError, VniExhausted
from adaptor.podnet._model import (
    POD_VM_MAX_MTU,
    VXLAN_DEVICE,
    Neighbor,
    PodNetwork,
    Route,
    Tunnel,
    TunnelState,
)
from adaptor.podnet._netns import check_netns
from adaptor.podnet._sandbox import SandboxPodNetwork, pod_network_section, write_apf_copy
from adaptor.podnet._service import (
    VNI_POOL,
    LocalRemote,
    PodNet,
    PodNetSettings,
    VniLeases,
    is_local,
)

__all__ = [
    "POD_VM_MAX_MTU",
    "VNI_POOL",
    "VXLAN_DEVICE",
    "BadNetns",
    "LocalRemote",
    "Neighbor",
    "NetnsGone",
    "PodNet",
    "PodNetError",
    "PodNetSettings",
    "PodNetwork",
    "Route",
    "SandboxPodNetwork",
    "Tunnel",
    "TunnelError",
    "TunnelState",
    "VniExhausted",
    "VniLeases",
    "check_netns",
    "is_local",
    "pod_network_section",
    "write_apf_copy",
]
