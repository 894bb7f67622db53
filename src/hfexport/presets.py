"""Tiny random models, built offline from a config, with sample inputs made for each.

`tiny:<name>` on the CLI, the architecture panel of the tests and the coverage matrix all use
this one table. Weights are random (`torch.manual_seed(seed)`) but scaled like real ones, so
numerical comparisons mean something.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Preset", "SubConfig", "PRESETS", "build_preset", "preset_names", "sample_inputs"]

_TEXT = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def _text_inputs(config: Any, batch: int = 1, seq: int = 8, *, token_type_ids: bool = False) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, config.vocab_size, (batch, seq), generator=generator)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if token_type_ids:
        out["token_type_ids"] = torch.zeros_like(ids)
    return out


def _seq2seq_inputs(config: Any) -> dict[str, torch.Tensor]:
    out = _text_inputs(config, seq=7)
    out["decoder_input_ids"] = torch.tensor([[config.decoder_start_token_id or 0, 5, 9]])
    return out


def _image_inputs(config: Any) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    size = config.image_size
    return {"pixel_values": torch.randn(1, config.num_channels, size, size, generator=generator)}


def _whisper_inputs(config: Any) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    frames = 2 * config.max_source_positions
    return {
        "input_features": torch.randn(1, config.num_mel_bins, frames, generator=generator),
        "decoder_input_ids": torch.tensor([[config.decoder_start_token_id, 5, 9]]),
    }


def _audio_inputs(config: Any) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {"input_values": torch.randn(1, 800, generator=generator)}


def _llava_inputs(config: Any) -> dict[str, torch.Tensor]:
    """A prompt with one image: its patch tokens (the image token repeated) between text tokens."""
    generator = torch.Generator().manual_seed(1)
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    ids = torch.cat([torch.tensor([[1, 5]]), torch.full((1, patches), config.image_token_index),
                     torch.tensor([[7, 9, 11]])], dim=1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(1, vision.num_channels, vision.image_size, vision.image_size,
                                        generator=generator)}


@dataclasses.dataclass(frozen=True)
class SubConfig:
    """A nested config (a multimodal model's vision or text config), built by class name."""

    config_class: str
    kwargs: dict[str, Any]

    def build(self) -> Any:
        import transformers

        return getattr(transformers, self.config_class)(**self.kwargs)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A tiny model: which transformers classes, the config kwargs, and how to make sample inputs."""

    name: str
    model_class: str
    config_class: str
    config: dict[str, Any]
    inputs: Callable[[Any], dict[str, Any]]
    kind: str  # decoder | ssm | encoder-decoder | encoder | vision | audio | multimodal
    generative: bool = False

    def build(self, seed: int = 0) -> tuple[torch.nn.Module, dict[str, Any]]:
        import transformers

        kwargs = {key: value.build() if isinstance(value, SubConfig) else value for key, value in self.config.items()}
        config = getattr(transformers, self.config_class)(**kwargs)
        torch.manual_seed(seed)
        model = getattr(transformers, self.model_class)(config).eval()
        return model, self.inputs(model.config)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("llama", "LlamaForCausalLM", "LlamaConfig", dict(_TEXT), _text_inputs, "decoder", True),
    Preset("qwen3", "Qwen3ForCausalLM", "Qwen3Config", dict(_TEXT, head_dim=8), _text_inputs, "decoder", True),
    Preset("gpt2", "GPT2LMHeadModel", "GPT2Config",
           dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2), _text_inputs, "decoder", True),
    Preset("mistral", "MistralForCausalLM", "MistralConfig", dict(_TEXT, sliding_window=4, head_dim=8),
           _text_inputs, "decoder", True),
    Preset("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
           dict(_TEXT, head_dim=8, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                decoder_sparse_step=1), _text_inputs, "decoder", True),
    Preset("mamba", "MambaForCausalLM", "MambaConfig",
           dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                intermediate_size=64), _text_inputs, "ssm", True),
    Preset("llava", "LlavaForConditionalGeneration", "LlavaConfig",
           dict(vision_config=SubConfig("CLIPVisionConfig", dict(hidden_size=32, intermediate_size=64,
                                                                 num_hidden_layers=2, num_attention_heads=4,
                                                                 image_size=16, patch_size=4)),
                text_config=SubConfig("LlamaConfig", dict(_TEXT)), image_token_index=120, vision_feature_layer=-1),
           _llava_inputs, "multimodal", True),
    Preset("bert", "BertModel", "BertConfig",
           dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=128),
           lambda config: _text_inputs(config, token_type_ids=True), "encoder"),
    Preset("t5", "T5ForConditionalGeneration", "T5Config",
           dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0),
           _seq2seq_inputs, "encoder-decoder", True),
    Preset("vit", "ViTForImageClassification", "ViTConfig",
           dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, num_labels=5), _image_inputs, "vision"),
    Preset("whisper", "WhisperForConditionalGeneration", "WhisperConfig",
           dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
                max_source_positions=16, max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
                eos_token_id=2, bos_token_id=1), _whisper_inputs, "encoder-decoder", True),
    Preset("wav2vec2", "Wav2Vec2Model", "Wav2Vec2Config",
           dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=2, num_feat_extract_layers=2), _audio_inputs, "audio"),
]}


def preset_names() -> list[str]:
    return list(PRESETS)


def build_preset(name: str, seed: int = 0) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Build `tiny:<name>` (the prefix is optional): a random model and its sample inputs."""
    key = name.removeprefix("tiny:")
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join('tiny:' + n for n in PRESETS)}")
    return PRESETS[key].build(seed)


def sample_inputs(name: str, model: torch.nn.Module) -> dict[str, Any]:
    return PRESETS[name.removeprefix("tiny:")].inputs(model.config)
