"""The XNNPACK partitioner, with reshape-like ops refused where XNNPACK's serializer would fail.

# NOTE: XNNPACK serializes `view_copy`/`unsqueeze_copy` as a static reshape that allows at most
# one dynamic output dimension, and lowers a 1-D convolution as unsqueeze -> conv2d -> squeeze
# (the same reshape). The partitioner's configs (executorch 1.4.1) do not check that, so a dynamic
# Wav2Vec2 export failed at lowering ("XNNPACK reshape only supports 1 dynamic dimension").
# Refusing those nodes in the partitioner keeps them on ExecuTorch's portable kernels, which is
# what partial delegation is for, instead of failing the export.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["xnnpack_partitioner", "RESHAPE_LIKE"]

logger = logging.getLogger("hfexport")

#: Configs whose XNNPACK lowering is (or includes) a static reshape: one dynamic output dim at most.
RESHAPE_LIKE = ("view_copy.default", "unsqueeze_copy.default", "convolution.default")


def _dynamic_dims(node: torch.fx.Node) -> int:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 0
    return sum(1 for dim in value.shape if not isinstance(dim, int))


def _strict(config_class: type) -> type:
    class StrictReshapeConfig(config_class):
        def check_constraints(self, node: torch.fx.Node, ep: Any) -> bool:
            if not super().check_constraints(node, ep):
                return False
            is_conv1d = "convolution" in str(node.target) and len(node.meta["val"].shape) == 3
            is_reshape = "convolution" not in str(node.target)
            if (is_reshape or is_conv1d) and _dynamic_dims(node) > 1:
                logger.debug("%s stays on portable kernels: %d dynamic output dims (XNNPACK takes 1)",
                             node.name, _dynamic_dims(node))
                return False
            return True

    StrictReshapeConfig.__name__ = f"Strict{config_class.__name__}"
    return StrictReshapeConfig


def xnnpack_partitioner() -> Any:
    """An `XnnpackPartitioner` whose reshape-like configs also check the output's dynamic dims."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    configs = [_strict(c) if getattr(c, "target_name", None) in RESHAPE_LIKE else c for c in ALL_PARTITIONER_CONFIGS]
    return XnnpackPartitioner(configs=configs)
