"""LLaVA's image features as one module: what a vendor's VLM runner calls its vision encoder.

Used by OpenVINO GenAI's `VLMPipeline` folder (`backends/openvino/vlm.py`, its
`vision_embeddings` model) and ExecuTorch's `MultimodalRunner` program
(`backends/executorch/multimodal.py`, its `vision_encoder` method). It registers no patch.

# NOTE: the tower, the feature layer and the projector in one graph, written here from
# transformers 5.24's `LlavaModel.get_image_features` rather than called: that method returns a
# Python list of per-image tensors, which would fix the batch at the traced size.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LlavaVisionEmbeddings"]


class LlavaVisionEmbeddings(torch.nn.Module):
    """`pixel_values` -> LLaVA's projected image features `[batch, patches, hidden]`: the tower's
    hidden states at `vision_feature_layer`, its CLS row dropped under the "default" strategy,
    through the projector (transformers 5.24 `LlavaModel.get_image_features`, one layer)."""

    def __init__(self, model: Any):
        super().__init__()
        base = model.model
        self.tower, self.projector = base.vision_tower, base.multi_modal_projector
        self.layer = model.config.vision_feature_layer
        self.drop_first = model.config.vision_feature_select_strategy == "default"

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The projected features of `pixel_values` `[batch, 3, size, size]`."""
        hidden = self.tower(pixel_values, output_hidden_states=True).hidden_states[self.layer]
        return self.projector(hidden[:, 1:] if self.drop_first else hidden)
