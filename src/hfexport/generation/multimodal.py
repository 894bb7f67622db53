"""Generation from an image: the prefill of a multimodal export, driven component by component.

```python
runner = GenerationRunner.load("out/tiny-qwen2-vl")      # hfexport export tiny:qwen2_vl --generate
runner.generate(input_ids, max_new_tokens=8, pixel_values=..., image_grid_thw=...)  # a processor's output
```

# NOTE: the merge of image features into the prompt happens here, between graphs, rather than
# inside one exported prefill: `decompose_for_generation` splits a multimodal model's prefill at
# the modules `generate` calls (tower, projector, language model, head), and each is exported and
# validated on its own. The runner then does what the top-level forward does between them
# (transformers 5.24 `get_image_features` + `get_placeholder_mask` + `masked_scatter`):
#   `text_embeddings(input_ids)` -> the image encoder's features (`image_prompt.features`, its CLS
#   row dropped where the model drops it) -> the projector where separate -> written over the rows
#   of the image tokens -> `language_model(inputs_embeds, position_ids)` -> `lm_head` on the last
#   position. Qwen2-VL's 3-D M-RoPE positions come from transformers' own `get_rope_index`, run on a
#   model built on the meta device from the saved config (no weights), so they are computed as
#   transformers computes them. The decode steps are the text loop's (`loop.DecodeState`), with the
#   rope delta added to the M-RoPE rows.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ExportError, PrepareError
from .components import PROJECTOR_NAMES

__all__ = ["image_prompt_entry", "audio_prompt_entry", "ImagePrefill", "AudioPrefill", "IMAGE_INPUT_ALIASES"]

#: Image encoder input -> the processor's name for it (Qwen2-VL's tower takes `hidden_states`, `grid_thw`).
IMAGE_INPUT_ALIASES = {"hidden_states": "pixel_values", "grid_thw": "image_grid_thw"}


def image_prompt_entry(model: Any, artifacts: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `image_prompt` entry for a multimodal export (`{}` for any other): what a
    runner needs to build the prefill without the model's class.

    Keys: `image_token_id` (the placeholder the processor repeats once per feature row),
    `video_token_id` (or None), `features` (the image encoder output the language model reads),
    `drop_first` (the CLS row is dropped, LLaVA's `vision_feature_select_strategy="default"`),
    `mrope` (positions from transformers' `get_rope_index`, Qwen2-VL), `spatial_merge_size`."""
    from ..capture.record import record_of

    if model is None or "image_encoder" not in artifacts:
        return {}
    config = model.config
    outputs = record_of(artifacts["image_encoder"]).output_names
    features = next((name for name in outputs if name.startswith("hidden_states.")),
                    "pooler_output" if "pooler_output" in outputs and not hasattr(config, "vision_feature_layer")
                    else "last_hidden_state")
    token = getattr(config, "image_token_id", None)
    token = getattr(config, "image_token_index", None) if token is None else token
    vision = getattr(config, "vision_config", None)
    return {"image_prompt": {
        "image_token_id": int(token),
        "video_token_id": getattr(config, "video_token_id", None),
        "features": features,
        "drop_first": getattr(config, "vision_feature_select_strategy", None) == "default",
        "mrope": hasattr(getattr(model, "base_model", model), "get_rope_index"),
        "spatial_merge_size": getattr(vision, "spatial_merge_size", None),
    }}


def _meta_base_model(config: Any) -> torch.nn.Module:
    """The base model of `config`'s architecture built on the meta device (no weights), for its
    position helpers (`get_rope_index`)."""
    from transformers import AutoModel

    with torch.device("meta"):
        return AutoModel.from_config(config)


class ImagePrefill:
    """The prefill of a multimodal export (see the module's note): embeds, image features merged
    at the image tokens, the language model, the head. `AudioPrefill` merges an audio clip's rows."""

    #: the manifest entry it reads, and the placeholder token's key in it
    ENTRY, TOKEN = "image_prompt", "image_token_id"

    def __init__(self, runner: Any):
        self.runner = runner
        entry = runner.export.manifest.get(self.ENTRY)
        if entry is None:
            raise ExportError(f"{runner.export.directory}'s manifest has no {self.ENTRY} entry",
                              remedy="export the model again with this version of hfexport (--generate)")
        self.entry = entry
        self.rope_index = None  # a meta model's `get_rope_index`, built at the first M-RoPE prompt

    def run(self, ids: torch.Tensor, inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """Prefill on the prompt `ids` and the processor's image (audio) inputs; returns the last
        position's logits `[1, 1, vocab]`, the cache leaves, and the rope delta the decode steps
        add to the M-RoPE rows (0 without M-RoPE)."""
        embeds = self._run("text_embeddings", {"input": ids})["output"].clone()
        placeholders = ids == self.entry[self.TOKEN]
        if placeholders.any():
            features = self.features(inputs, int(placeholders.sum()))
            embeds[placeholders] = features.to(embeds.dtype)
        positions, delta = self.positions(ids, inputs)
        outputs = self._run("language_model", {"inputs_embeds": embeds, "position_ids": positions,
                                               "attention_mask": torch.ones_like(ids)})
        logits = self._run("lm_head", {"input": outputs["last_hidden_state"][:, -1:]})["output"]
        cache = {name: value for name, value in outputs.items() if name.startswith("cache.")}
        return logits, cache, delta

    def features(self, inputs: dict[str, Any], placeholders: int) -> torch.Tensor:
        """One feature row per placeholder token `[rows, hidden]`, refused where the counts differ."""
        features = self.image_features(inputs)
        if features.shape[0] != placeholders:
            raise ExportError(
                f"the prompt has {placeholders} image tokens but the image gives {features.shape[0]} "
                "feature rows", remedy="build the prompt with the processor that made pixel_values (one image "
                f"token {self.entry['image_token_id']} per feature row)")
        return features

    def image_features(self, image_inputs: dict[str, Any]) -> torch.Tensor:
        """The image features the language model reads, one row per image token `[rows, hidden]`."""
        record = self.runner.records["image_encoder"]
        feed = {}
        for name in record.input_names:
            given = IMAGE_INPUT_ALIASES.get(name, name)
            if given not in image_inputs:
                raise ExportError(f"the image encoder takes {given!r}", remedy=f"pass {given}=... (the processor's output)")
            feed[name] = torch.as_tensor(image_inputs[given])
        features = self._run("image_encoder", feed)[self.entry["features"]]
        if self.entry["drop_first"]:
            features = features[:, 1:]
        features = self._projected(features)
        return features.reshape(-1, features.shape[-1])

    def _projected(self, features: torch.Tensor) -> torch.Tensor:
        """`features` through the projector where the export has one.

        The projector is the component named as `decompose_for_generation` names it: a folder may
        hold other components, a runtime's own pipeline's models (e.g. its split vision tower)."""
        projector = next((name for name in PROJECTOR_NAMES if name in self.runner.runners), None)
        if projector is None:
            return features
        return self._run(projector, {self.runner.records[projector].input_names[0]: features})["output"]

    def positions(self, ids: torch.Tensor, image_inputs: dict[str, Any]) -> tuple[torch.Tensor, int]:
        """The language model's `position_ids` for the prompt and the rope delta: `[1, n]`, or for
        M-RoPE `[4, 1, n]` (text positions, then `get_rope_index`'s three rows) as transformers 5.24
        `Qwen2VLForConditionalGeneration._prepare_position_ids_for_generation` stacks them."""
        text = torch.arange(ids.shape[1])[None]
        if not self.entry.get("mrope"):
            return text, 0
        if self.rope_index is None:
            self.rope_index = _meta_base_model(self.runner.export.config).get_rope_index
        types = torch.zeros_like(ids, dtype=torch.int32)
        types[ids == self.entry["image_token_id"]] = 1
        if self.entry.get("video_token_id") is not None:
            types[ids == self.entry["video_token_id"]] = 2
        grid = image_inputs.get("image_grid_thw")
        rows, delta = self.rope_index(ids, types, image_grid_thw=None if grid is None else torch.as_tensor(grid),
                                      attention_mask=torch.ones_like(ids))
        return torch.cat([text[None], rows]), int(delta.reshape(-1)[0])

    def _run(self, name: str, feed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run component `name` on the inputs of `feed` it takes (an error naming one it lacks)."""
        record = self.runner.records[name]
        missing = [n for n in record.input_names if n not in feed]
        if missing:
            raise ExportError(f"the runner cannot fill {name}'s inputs {missing}",
                              remedy=f"drive {name} yourself; its inputs are listed in manifest.json")
        return self.runner.runners[name].run_named({n: feed[n] for n in record.input_names})


def audio_prompt_entry(model: Any, artifacts: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `audio_prompt` entry for an audio-text LLM's export (`{}` for any other): what
    a runner needs to merge a clip's rows into the prompt without the model's class.

    Keys: `audio_token_id` (the placeholder the processor repeats once per row of the clip),
    `features` (the audio encoder output the projector reads), `frame_mask` (the encoder's per-frame
    mask input, `audio_tower.AudioTowerFront`; None for a tower that takes the features alone) and
    `rows_heard` (entry `n`: the rows of a clip of `n` frames, padding excluded, by the tower's own
    `_get_feat_extract_output_lengths`, read from transformers 5.24; None where it has none: every row)."""
    from ..capture.record import record_of

    if model is None or "audio_encoder" not in artifacts:
        return {}
    config = model.config
    token = getattr(config, "audio_token_id", None)
    token = getattr(config, "audio_token_index", None) if token is None else token
    record = record_of(artifacts["audio_encoder"])
    frame_mask = next((name for name in record.input_names if name != "input_features"), None)
    return {"audio_prompt": {"audio_token_id": int(token), "features": "last_hidden_state", "frame_mask": frame_mask,
                             "rows_heard": _rows_heard(model, record) if frame_mask else None}}


def _rows_heard(model: Any, record: Any) -> list[int] | None:
    """Rows of the audio encoder's output for each count of frames heard, `0..frames`."""
    shapes = dict(zip(record.input_names, record.input_shapes))
    frames = (shapes.get("input_features") or [None])[-1]
    lengths = getattr(model.get_encoder(modality="audio"), "_get_feat_extract_output_lengths", None)
    if not isinstance(frames, int) or lengths is None:
        return None
    rows = lengths(torch.arange(frames + 1))
    return (rows[-1] if isinstance(rows, tuple) else rows).tolist()


class AudioPrefill(ImagePrefill):
    """The prefill of an audio-text LLM's export: the clip's rows (audio encoder, projector, padding
    rows left out) written over the audio tokens, then as `ImagePrefill` (text positions)."""

    ENTRY, TOKEN = "audio_prompt", "audio_token_id"

    def features(self, inputs: dict[str, Any], placeholders: int) -> torch.Tensor:
        """The rows of every clip in `inputs` (the processor's `input_features` and per-frame mask),
        one per audio token; refused where the prompt has another number of audio tokens."""
        record = self.runner.records["audio_encoder"]
        missing = [name for name in record.input_names if name not in inputs]
        if missing:
            raise PrepareError(f"the audio encoder takes {', '.join(missing)}",
                               remedy="pass the processor's output for the clip (input_features and its mask)")
        # as the export takes them: the processor's int32 mask given to a capture made with int64, say
        dtypes = dict(zip(record.input_names, record.input_dtypes or []))
        feed = {name: torch.as_tensor(inputs[name]).to(getattr(torch, dtypes.get(name) or "float32"))
                for name in record.input_names}
        features = self._projected(self._run("audio_encoder", feed)[self.entry["features"]])
        table, mask = self.entry.get("rows_heard"), self.entry.get("frame_mask")
        heard = [table[int(n)] for n in feed[mask].sum(-1).tolist()] if table and mask else \
            [features.shape[1]] * features.shape[0]
        if sum(heard) != placeholders:
            raise PrepareError(
                f"the prompt has {placeholders} audio tokens but the clip gives {sum(heard)} rows",
                remedy="build the prompt with the processor that made input_features (one audio token "
                f"{self.entry['audio_token_id']} per row of the clip)")
        return torch.cat([clip[:rows] for clip, rows in zip(features, heard)])
