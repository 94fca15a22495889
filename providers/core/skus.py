"""What a GPU calls itself on a given instance type: NVIDIA's product name per cloud SKU.

One GPU model is sold in several forms: the A100 80GB is an SXM4 part on AWS p4de, GCP
a2-ultragpu and Azure ND A100 v4, but a PCIe card on Azure NC A100 v4; the V100 is SXM2 on AWS
and GCP, PCIe on Azure NCv3. NVIDIA's driver (and its DRA driver's `productName` attribute)
reports the form, so a DRA selector may tell them apart; selection must then know which form each
instance type carries. The rules below are the clouds' published size specifications; a type no
rule names reports its model's usual product name (`providers.core.gpus`).

`product_key` turns a product name into the token the annotation contract carries (`p=` in
`default_gpu_model`): lower case, runs of other characters as one `-`.
"""

from __future__ import annotations

import re
from functools import lru_cache

from providers.core.catalog import Cloud
from providers.core.gpus import GPU_MODELS

__all__ = ["product_key", "product_name"]

# (cloud, instance type pattern, GPU model) -> product name; first match wins.
_RULES: tuple[tuple[str, re.Pattern[str], str, str], ...] = tuple(
    (cloud, re.compile(pattern, re.IGNORECASE), model, product)
    for cloud, pattern, model, product in (
        # Azure NC A100 v4: "NVIDIA A100 80GB PCIe" (the ND A100 v4 sizes are SXM4 parts)
        ("azure", r"^(Standard_)?NC\d+ads_A100_v4$", "a100-80gb", "NVIDIA A100 80GB PCIe"),
        # Azure NCv3: Tesla V100 PCIe 16GB
        ("azure", r"^(Standard_)?NC\d+r?s_v3$", "v100", "Tesla V100-PCIE-16GB"),
        # GCP N1 with attached V100: SXM2 16GB; P100: PCIe 16GB (the model defaults)
    )
)


def _default(model: str) -> str:
    found = GPU_MODELS.get(model)
    return found.product_name if found is not None else model


@lru_cache(maxsize=4096)
def product_name(cloud: Cloud | str, instance_type: str, model: str) -> str:
    """The product name the GPUs of `instance_type` report (its model's usual name if no rule)."""
    for rule_cloud, pattern, rule_model, product in _RULES:
        if rule_cloud == cloud and rule_model == model and pattern.match(instance_type):
            return product
    return _default(model)


@lru_cache(maxsize=1024)
def product_key(product: str) -> str:
    """ "NVIDIA A100 80GB PCIe" -> "nvidia-a100-80gb-pcie" (the annotation's spelling)."""
    return "-".join(t for t in re.split(r"[^a-z0-9]+", product.lower()) if t)
