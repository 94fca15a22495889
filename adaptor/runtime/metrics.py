"""Prometheus metrics of the node daemon, on one registry the status API serves at /metrics.

Names follow Prometheus conventions (`_total` counters, `_seconds` histograms). Label values are
bounded: methods come from the Kata protocols, reasons are short categories, never user data.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

SANDBOXES = Gauge(
    "peerpods_sandboxes",
    "Sandboxes known to this adaptor, by state.",
    ["state"],
    registry=REGISTRY,
)
VM_CREATE_SECONDS = Histogram(
    "peerpods_vm_create_seconds",
    "Time from StartVM asking the provider for a VM until the VM exists.",
    ["provider"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
CAPACITY_FALLBACKS = Counter(
    "peerpods_capacity_fallbacks_total",
    "Create attempts that hit a capacity or quota error and moved to another zone or type.",
    ["provider", "reason"],
    registry=REGISTRY,
)
SELECTION_FAILURES = Counter(
    "peerpods_selection_failures_total",
    "Requests no instance type could serve, by reason category.",
    ["reason"],
    registry=REGISTRY,
)
PROXY_CALLS = Counter(
    "peerpods_proxy_calls_total",
    "Agent calls relayed by the proxy, by method and gRPC status code.",
    ["method", "code"],
    registry=REGISTRY,
)
GC_DELETIONS = Counter(
    "peerpods_gc_deleted_vms_total",
    "Owned VMs with no known sandbox that the garbage collector deleted.",
    ["provider"],
    registry=REGISTRY,
)
START_FAILURES = Counter(
    "peerpods_start_failures_total",
    "StartVM calls that failed, by reason category (quota, selection, capacity, cloud, ...).",
    ["reason"],
    registry=REGISTRY,
)
VM_DELETE_FAILURES = Counter(
    "peerpods_vm_delete_failures_total",
    "VM deletes that failed and are retried (StopVM's teardown, the reaper).",
    ["provider"],
    registry=REGISTRY,
)
REAPED_VMS = Counter(
    "peerpods_reaped_vms_total",
    "VMs of failed or stopping sandboxes the reaper deleted after the grace period.",
    ["provider"],
    registry=REGISTRY,
)

PREEMPTIONS = Counter(
    "peerpods_sandboxes_preempted_total",
    "Running sandboxes whose VM the cloud took away (Spot preemption, eviction or deletion).",
    ["provider", "capacity_type"],
    registry=REGISTRY,
)
ABANDONED = Counter(
    "peerpods_sandboxes_abandoned_total",
    "Sandboxes found running at start whose shim never connected again (within the reconnect "
    "grace): torn down, VM deleted.",
    ["provider"],
    registry=REGISTRY,
)

WARM_POOL_SIZE = Gauge(
    "peerpods_warm_pool_size",
    "VMs of each warm pool by state: launching (booting, pulling), warm (stopped, ready), "
    "adopting (being handed to a sandbox).",
    ["pool", "state"],
    registry=REGISTRY,
)
WARM_POOL_ADOPTIONS = Counter(
    "peerpods_warm_pool_adoptions_total",
    "StartVMs that got a warm VM.",
    ["pool"],
    registry=REGISTRY,
)
WARM_POOL_MISSES = Counter(
    "peerpods_warm_pool_misses_total",
    "StartVMs that launched a VM cold, by why: no-pool, empty, spot, image, adopt-failed.",
    ["reason"],
    registry=REGISTRY,
)
WARM_POOL_REFILL_SECONDS = Histogram(
    "peerpods_warm_pool_refill_seconds",
    "From a warm VM's launch to its being stopped and ready.",
    buckets=(5, 15, 30, 60, 90, 120, 180, 300, 600, 1200, 2400, 3600),
    registry=REGISTRY,
)
WARM_POOL_COST_PER_HOUR = Gauge(
    "peerpods_warm_pool_cost_per_hour",
    "What the warm pools' VMs bill per hour while stopped (their disks), in USD.",
    registry=REGISTRY,
)

STATES = ("created", "starting", "running", "stopping", "failed", "preempted")


def set_sandbox_counts(counts: dict[str, int]) -> None:
    """Publish sandbox counts per state (every known state is published, zero included)."""
    for state in STATES:
        SANDBOXES.labels(state=state).set(counts.get(state, 0))
    for state, count in counts.items():
        if state not in STATES:
            SANDBOXES.labels(state=state).set(count)
