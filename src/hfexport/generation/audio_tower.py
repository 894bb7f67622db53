"""An audio-text LLM's audio tower as a component a runner can feed: the processor's per-frame mask in,
the tower's rows out (`AudioTowerFront`), and a decode step without the audio inputs it ignores.

# NOTE: `generate` calls an audio-text LLM's tower (Qwen2-Audio's) with a mask the top-level forward
# builds from the processor's per-frame `feature_attention_mask`: one key-padding row over the
# tower's positions (the frames after its stride-2 convolution), bidirectional, and none at all when
# the clip fills the feature extractor's chunk. Exported as captured, the tower would take that 4-D
# mask, which no processor gives (its size is the tower's, its rule the model's), and its query
# axis reads as a token axis the tower fixes. So the component is the tower behind a front that
# takes what the processor gives, `(input_features, <per-frame mask>)`, and builds the key-padding
# mask in the captured layout (bool, or additive floats for eager attention): positions
# `ceil(frames heard / stride)`, the rule of a stride-s convolution padded to keep `frames / s`
# positions. The front is kept only where it reproduces the captured mask exactly on the capture's
# clip (odd-length in the presets, so floor and ceil differ), as `decompose.py` keeps a static
# cache's mask. No model class is named here: the per-frame mask is the prompt's 2-D input as long
# as the features' frame axis, the stride the ratio of frames to the captured mask's positions.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..errors import PrepareError

__all__ = ["AudioTowerFront", "audio_tower_component", "without_audio_inputs", "frame_mask_name"]


class AudioTowerFront(torch.nn.Module):
    """`tower` taking the processor's `input_features` and per-frame mask (`mask_name`): the mask
    becomes the key-padding mask over the tower's positions (`frames / stride`), every query row the
    same, as bool or (`additive`) 0 / dtype-min floats."""

    def __init__(self, tower: torch.nn.Module, mask_name: str, stride: int, additive: bool):
        super().__init__()
        self.tower, self.mask_name, self.stride, self.additive = tower, mask_name, int(stride), additive

    @property
    def config(self) -> Any:
        """The tower's config (what exporters read bounds from)."""
        return getattr(self.tower, "config", None)

    def forward(self, **kwargs: Any) -> Any:
        """The tower's outputs for `input_features` with the mask built from `kwargs[mask_name]`."""
        frames = kwargs.pop(self.mask_name)
        features = kwargs["input_features"]
        positions = features.shape[-1] // self.stride
        # position j is heard where j < ceil(frames heard / stride), i.e. j * stride < frames heard: no
        # integer division in the graph (OpenVINO 2026.4.1 converts an int64 `(n + 1) // 2` with round half to
        # even: 15 // 2 gave 8)
        heard = frames.sum(-1)
        keep = torch.arange(positions, device=features.device)[None] * self.stride < heard[:, None]
        # one clip per row of features: the mask's batch is theirs (one symbol for both under torch.export)
        mask = keep[:, None, None, :].expand(features.shape[0], 1, positions, positions)
        if self.additive:
            zero = torch.zeros((), dtype=features.dtype, device=features.device)
            mask = torch.where(mask, zero, torch.finfo(features.dtype).min)
        return self.tower(**kwargs, attention_mask=mask)


def frame_mask_name(prompt: dict[str, Any]) -> str | None:
    """The prompt's per-frame mask of its `input_features` (Qwen2-Audio's `feature_attention_mask`):
    a 2-D input other than the text's mask, as long as the features' frame axis."""
    features = prompt.get("input_features")
    if not isinstance(features, torch.Tensor):
        return None
    return next((name for name, value in prompt.items() if name not in ("attention_mask", "input_ids")
                 and isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[-1] == features.shape[-1]),
                None)


def audio_tower_component(tower: torch.nn.Module, call: dict[str, Any], prompt: dict[str, Any], *,
                          model_name: str, for_runner: bool) -> tuple[torch.nn.Module, dict[str, Any]]:
    """`(module, kwargs)` of the audio encoder component: `AudioTowerFront` where the captured call
    (`call`) took a 4-D mask it reproduces from the prompt's per-frame mask; else the tower as captured.

    Raises:
        PrepareError: with `for_runner` (an export folder), where the runner could not feed the
            tower: a mask it cannot rebuild, or a capture clip filling the whole chunk, which shows
            no masking to reproduce.
    """
    name = frame_mask_name(prompt)
    mask = call.get("attention_mask")
    if name is None or not isinstance(call.get("input_features"), torch.Tensor):
        return tower, call
    if mask is None:  # a tower that ignores padding (none on a short clip) takes the features alone
        if for_runner and bool(prompt[name].all()):
            raise PrepareError(
                f"{model_name}'s sample clip fills the feature extractor's chunk, so the capture does not show "
                "how its audio tower masks a shorter clip", model=model_name,
                remedy="export with sample inputs whose clip is shorter than the chunk (the processor's output on "
                "a short clip: feature_attention_mask holding zeros)")
        return tower, call
    features = call["input_features"]
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 4 and features.shape[-1] % mask.shape[-1] == 0):
        return _refused(tower, call, model_name, for_runner, "its mask is not one row per tower position")
    stride = features.shape[-1] // mask.shape[-1]
    front = AudioTowerFront(tower, name, stride, additive=mask.is_floating_point())
    kwargs = {**{k: v for k, v in call.items() if k != "attention_mask"}, name: prompt[name]}
    with torch.no_grad():
        built = _built_mask(front, copy.deepcopy(kwargs))
    if built is None or built.shape != mask.shape or not torch.equal(built, mask):
        return _refused(tower, call, model_name, for_runner,
                        f"its mask is not the key-padding mask of ceil(frames heard / {stride}) positions")
    return front, kwargs


def _built_mask(front: AudioTowerFront, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The mask `front` hands its tower on `kwargs` (its tower's call intercepted)."""
    seen: list[torch.Tensor] = []

    def hook(_module, _args, called):
        seen.append(called.get("attention_mask"))

    handle = front.tower.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        front(**kwargs)
    finally:
        handle.remove()
    return seen[0] if seen else None


def _refused(tower: torch.nn.Module, call: dict[str, Any], model_name: str, for_runner: bool,
             why: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    if for_runner:
        raise PrepareError(f"{model_name}'s audio tower takes a mask the runner cannot build from the processor's "
                           f"per-frame mask: {why}", model=model_name,
                           remedy="report this model class; from Python, decompose_for_generation(model, inputs) "
                           "gives the tower as generate() called it, to drive yourself")
    return tower, call


def without_audio_inputs(step: dict[str, Any], names: tuple[str, ...], same_logits: Any) -> dict[str, Any]:
    """A decode step's kwargs without the audio inputs `names` that `generate` passes on every step
    (Qwen2-Audio's `feature_attention_mask`) where the step gives the same logits without them
    (`same_logits(step, candidate)`): the audio is in the cache by then."""
    candidate = {k: v for k, v in step.items() if k not in names}
    if len(candidate) == len(step) or not same_logits(step, candidate):
        return step
    return candidate
