"""What every part of the node daemon runs with: structured logs (`logs`), the Prometheus
metrics on one registry (`metrics`, used as a module: `metrics.VM_CREATE_SECONDS`) and one owned
background task (`periodic`). Other packages import the names below from `adaptor.runtime`.
"""

from adaptor.runtime.logs import JsonFormatter, bind_sandbox, sandbox_context
from adaptor.runtime.periodic import OwnedTask

__all__ = ["JsonFormatter", "OwnedTask", "bind_sandbox", "sandbox_context"]
