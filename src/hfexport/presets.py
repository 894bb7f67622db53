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

__all__ = ["Preset", "SubConfig", "PRESETS", "build_preset", "preset_names", "sample_inputs", "tiny_processor",
           "tiny_tokenizer", "CHATML_TEMPLATE"]

_TEXT = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def text_inputs(config: Any, batch: int = 1, seq: int = 8, *, token_type_ids: bool = False) -> dict[str, torch.Tensor]:
    """Random token ids (seeded) and a mask of ones for a text model's `config`, `[batch, seq]`."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, config.vocab_size, (batch, seq), generator=generator)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if token_type_ids:
        out["token_type_ids"] = torch.zeros_like(ids)
    return out


def _seq2seq_inputs(config: Any) -> dict[str, torch.Tensor]:
    out = text_inputs(config, seq=7)
    out["decoder_input_ids"] = torch.tensor([[config.decoder_start_token_id or 0, 5, 9]])
    return out


def image_inputs(config: Any) -> dict[str, torch.Tensor]:
    """Random `pixel_values` (seeded) for a vision model's `config`: one image of its size."""
    generator = torch.Generator().manual_seed(1)
    size = config.image_size
    return {"pixel_values": torch.randn(1, config.num_channels, size, size, generator=generator)}


def whisper_inputs(config: Any) -> dict[str, torch.Tensor]:
    """Random `input_features` (seeded) for a Whisper-like `config`, and three decoder ids."""
    generator = torch.Generator().manual_seed(1)
    frames = 2 * config.max_source_positions
    return {
        "input_features": torch.randn(1, config.num_mel_bins, frames, generator=generator),
        "decoder_input_ids": torch.tensor([[config.decoder_start_token_id, 5, 9]]),
    }


def audio_inputs(config: Any) -> dict[str, torch.Tensor]:
    """Random `input_values` (seeded): 800 samples of raw audio."""
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


def qwen2_audio_tokens(frames: int) -> int:
    """The audio tokens Qwen2-Audio's processor writes for a clip of `frames` feature frames (its
    tower's two stride-2 stages, transformers 5.24 `Qwen2AudioProcessor._process_audio`)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def _qwen2_audio_inputs(config: Any) -> dict[str, torch.Tensor]:
    """A prompt with one clip shorter than the encoder's chunk (19 of its 32 frames, so the capture
    sees the padding masked): random features, the per-frame mask, one audio token per row of the
    clip between text tokens, as the processor lays them out."""
    generator = torch.Generator().manual_seed(1)
    audio = config.audio_config
    frames, heard = 2 * audio.max_source_positions, 19
    ids = torch.cat([torch.tensor([[1, 5, QWEN2_AUDIO_SPECIAL["<|audio_bos|>"]]]),
                     torch.full((1, qwen2_audio_tokens(heard)), config.audio_token_id),
                     torch.tensor([[QWEN2_AUDIO_SPECIAL["<|audio_eos|>"], 7, 9]])], dim=1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "input_features": torch.randn(1, audio.num_mel_bins, frames, generator=generator),
            "feature_attention_mask": (torch.arange(frames) < heard).int()[None]}  # int32, as the processor's


def qwen2_vl_image(config: Any, grid: list[tuple[int, int, int]],
                   seed: int = 1) -> dict[str, torch.Tensor]:
    """Flattened patches and `image_grid_thw` for images of the given `(t, h, w)` patch grids,
    laid out as Qwen2-VL's processor lays them out: `(sum t*h*w, C * T * P * P)`."""
    vision = config.vision_config
    generator = torch.Generator().manual_seed(seed)
    patches = sum(t * h * w for t, h, w in grid)
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    return {"pixel_values": torch.randn(patches, width, generator=generator),
            "image_grid_thw": torch.tensor(grid)}


def _qwen2_vl_inputs(config: Any) -> dict[str, torch.Tensor]:
    """A prompt with one 4x6-patch image: vision start, one token per merged 2x2 block, vision end."""
    image = qwen2_vl_image(config, [(1, 4, 6)])
    tokens = 4 * 6 // config.vision_config.spatial_merge_size ** 2
    ids = torch.cat([torch.tensor([[1, 5, config.vision_start_token_id]]), torch.full((1, tokens), config.image_token_id),
                     torch.tensor([[config.vision_end_token_id, 7, 9]])], dim=1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), **image,
            "mm_token_type_ids": (ids == config.image_token_id).int()}


#: LLaVA's chat template in the layout of llava-1.5's ("USER: <image>\n... ASSISTANT:"), short.
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | upper }}: {% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<image>\n{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


#: Qwen2-VL's template in the tiny tokenizer's words: each turn "role: " then its parts, the image
#: as vision start, image pad, vision end (as Qwen2-VL's own template writes it).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


#: `tiny:whisper`'s special tokens by id (`WHISPER_SPECIAL`, the config's pad, decoder start and end at
#: 0-2, the prompt tokens at 123-127), laid out as an English-only Whisper's (whisper-tiny.en).
WHISPER_SPECIAL = {0: "<|pad|>", 1: "<|startoftranscript|>", 2: "<|endoftext|>", 123: "<|translate|>",
                   124: "<|transcribe|>", 125: "<|startofprev|>", 126: "<|nospeech|>", 127: "<|notimestamps|>"}
#: The symbols Whisper never writes (its generation config's `suppress_tokens`: punctuation it does not
#: transcribe) as `tiny:whisper`'s tokenizer numbers them (printable ASCII from id 3 on), then the
#: special tokens it suppresses (decoder start, translate, transcribe, previous text, no speech).
WHISPER_SUPPRESS_TOKENS = [ord(symbol) - 30 for symbol in '"#()*+/:;<=>@[\\]^_`{|}~'] + [1, 123, 124, 125, 126]
#: The tokens suppressed at the first step (`begin_suppress_tokens`): a space (byte-level 'Ġ', 97) and the end.
WHISPER_BEGIN_SUPPRESS_TOKENS = [97, 2]
#: What an English-only Whisper's `generation_config.json` adds (its `<|notimestamps|>` ends the decoder prompt).
WHISPER_GENERATION = dict(no_timestamps_token_id=127, prev_sot_token_id=125, is_multilingual=False,
                          return_timestamps=False)


#: `tiny:qwen2_audio`'s audio tokens by name (the config's audio token and the two that bracket a clip).
QWEN2_AUDIO_SPECIAL = {"<|AUDIO|>": 120, "<|audio_bos|>": 121, "<|audio_eos|>": 122}
#: Qwen2-Audio's chat template in the tiny tokenizer's words: ChatML turns, a clip as
#: `<|audio_bos|><|AUDIO|><|audio_eos|>` then a newline (Qwen2-Audio-7B-Instruct's, without its
#: default system turn and its "Audio N:" label).
QWEN2_AUDIO_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'audio' %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>\n{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_processor(name: str) -> Any:
    """The processor of the image-text or speech preset `name` made offline, or None for the others
    (`load_model("tiny:NAME")` carries it, so its export generates from an image or audio file).

    LLaVA's: a CLIP image processor (Pillow backend) resizing any image to the tiny tower's 16x16,
    a byte-level BPE tokenizer of the preset's vocabulary with `<image>` at the config's image token
    (120), and `LLAVA_CHAT_TEMPLATE`. Qwen2-VL's: its Pillow image processor with the tiny tower's
    patches (4 pixels, 2x2 merged, 2 frames) resizing an image to between 1 and 16 image tokens, the
    tokenizer with the config's image pad, video pad, vision start and end at 120-123, and
    `QWEN2_VL_CHAT_TEMPLATE`; built, as `hfexport` loads it, without the video processor
    transformers 5.24 cannot build without torchvision (`tokenizer_files.buildable_processor_class`).
    Whisper's: a `WhisperFeatureExtractor` of the preset's 8 mel bins over 1 s chunks at 16 kHz (the
    32 frames its encoder takes; a real Whisper's chunk is 30 s), and a byte-level BPE tokenizer of
    the preset's vocabulary with `WHISPER_SPECIAL`. Qwen2-Audio's: the same feature extractor (the 32
    frames its tower takes), a byte-level BPE tokenizer with ChatML's `<|endoftext|>`, `<|im_start|>`,
    `<|im_end|>` at 0-2 and `QWEN2_AUDIO_SPECIAL` at 120-122, and `QWEN2_AUDIO_CHAT_TEMPLATE`.
    Speech2Text's: a `Speech2TextFeatureExtractor` of the preset's 8 filter banks (Kaldi's 25 ms
    windows every 10 ms at 16 kHz, numpy's backend without torchaudio), and a byte-level BPE
    tokenizer with `<pad>`, `<s>`, `</s>` at the config's 0-2."""
    name = name.removeprefix("tiny:")
    if name == "llava":
        from transformers import CLIPImageProcessorPil, LlavaProcessor

        image_processor = CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
        return LlavaProcessor(image_processor=image_processor, tokenizer=_image_text_tokenizer(["<image>"]),
                              patch_size=4, vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=LLAVA_CHAT_TEMPLATE)
    if name == "qwen2_vl":
        from transformers import Qwen2VLProcessor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        from .folder.tokenizer_files import buildable_processor_class

        image_processor = Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                                   min_pixels=8 * 8, max_pixels=16 * 8 * 8)
        tokenizer = _image_text_tokenizer(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"])
        return buildable_processor_class(Qwen2VLProcessor)(image_processor=image_processor, tokenizer=tokenizer,
                                                           chat_template=QWEN2_VL_CHAT_TEMPLATE)
    if name == "whisper":
        from transformers import WhisperProcessor

        return WhisperProcessor(feature_extractor=_tiny_feature_extractor(), tokenizer=_speech_tokenizer())
    if name == "qwen2_audio":
        from transformers import Qwen2AudioProcessor

        return Qwen2AudioProcessor(feature_extractor=_tiny_feature_extractor(), tokenizer=_audio_text_tokenizer(),
                                   chat_template=QWEN2_AUDIO_CHAT_TEMPLATE)
    if name == "speech_to_text":
        from transformers import Speech2TextFeatureExtractor, Speech2TextProcessor

        bins = PRESETS[name].config["input_feat_per_channel"]
        return Speech2TextProcessor(feature_extractor=Speech2TextFeatureExtractor(feature_size=bins, num_mel_bins=bins),
                                    tokenizer=_speech2text_tokenizer())
    return None


def _tiny_feature_extractor() -> Any:
    """A `WhisperFeatureExtractor` of 8 mel bins over 1 s chunks at 16 kHz: 16 000 samples in 32
    frames, what the tiny speech towers take (2 x max_source_positions; a real Whisper's chunk is 30 s)."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=8, sampling_rate=16000, hop_length=500, chunk_length=1, n_fft=1000)


def _audio_text_tokenizer() -> Any:
    """`tiny:qwen2_audio`'s tokenizer: a byte-level BPE of the preset's 128 ids, ChatML's special
    tokens at 0-2 (the config's pad, BOS and EOS), `QWEN2_AUDIO_SPECIAL` at 120-122."""
    from transformers import PreTrainedTokenizerFast

    corpus = ["transcribe this audio", "what do you hear in this clip", "a tone and some noise",
              "the quick brown fox jumps over the lazy dog"] * 20
    first = min(QWEN2_AUDIO_SPECIAL.values())
    tokenizer = _byte_level_bpe(corpus, first, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], newline=True)
    tokenizer.add_special_tokens(list(QWEN2_AUDIO_SPECIAL))
    size = PRESETS["qwen2_audio"].config["text_config"]["vocab_size"]
    tokenizer.add_special_tokens([f"<unused{i}>" for i in range(size - tokenizer.get_vocab_size())])
    made = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    assert len(made) == size and made.convert_tokens_to_ids(list(QWEN2_AUDIO_SPECIAL)) == [120, 121, 122]
    return made


def _speech2text_tokenizer() -> Any:
    """`tiny:speech_to_text`'s tokenizer: a byte-level BPE of the preset's 128 ids with Speech2Text's
    `<pad>`, `<s>`, `</s>` at the config's pad, BOS and EOS (0-2)."""
    from transformers import PreTrainedTokenizerFast

    corpus = ["the quick brown fox jumps over the lazy dog", "a tone and some noise",
              "one two three four five six seven eight nine ten"] * 20
    size = PRESETS["speech_to_text"].config["vocab_size"]
    made = PreTrainedTokenizerFast(tokenizer_object=_byte_level_bpe(corpus, size, ["<pad>", "<s>", "</s>"]),
                                   pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    assert len(made) == size and made.convert_tokens_to_ids(["<pad>", "<s>", "</s>"]) == [0, 1, 2]
    return made


def _speech_tokenizer() -> Any:
    """`tiny:whisper`'s tokenizer: a byte-level BPE of the preset's 128 ids with `WHISPER_SPECIAL`
    where the config and `WHISPER_GENERATION` name them."""
    from transformers import PreTrainedTokenizerFast

    corpus = ["the quick brown fox jumps over the lazy dog", "hello, how are you today?",
              "she sells sea shells by the sea shore", "a tone and some noise",
              "one two three four five six seven eight nine ten"] * 20
    tail = sorted(i for i in WHISPER_SPECIAL if i > 2)
    tokenizer = _byte_level_bpe(corpus, tail[0], [WHISPER_SPECIAL[i] for i in range(3)])
    tokenizer.add_special_tokens([WHISPER_SPECIAL[i] for i in tail])
    made = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=WHISPER_SPECIAL[1],
                                   eos_token=WHISPER_SPECIAL[2], pad_token=WHISPER_SPECIAL[0])
    assert len(made) == PRESETS["whisper"].config["vocab_size"], len(made)
    assert all(made.convert_ids_to_tokens(i) == token for i, token in WHISPER_SPECIAL.items())
    assert made.convert_ids_to_tokens(WHISPER_SUPPRESS_TOKENS[:3]) == ['"', "#", "("]
    assert made.convert_ids_to_tokens(WHISPER_BEGIN_SUPPRESS_TOKENS[0]) == "\u0120"
    return made


def _image_text_tokenizer(special: list[str], first_special: int = 120) -> Any:
    """A byte-level BPE tokenizer whose `special` tokens take ids `first_special`, ... (a tiny
    preset's image token ids, its vocabulary 128): trained to `first_special` tokens, filled up with
    unused ones where training made fewer."""
    from transformers import PreTrainedTokenizerFast

    corpus = ["describe this image in a few words", "what is in the picture", "the quick brown fox"] * 20
    tokenizer = _byte_level_bpe(corpus, first_special, ["<s>", "</s>"])
    tokenizer.add_special_tokens(special)
    made = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    assert made.convert_tokens_to_ids(special) == list(range(first_special, first_special + len(special)))
    return made


#: The chat template of `tiny:llama`'s tokenizer: ChatML, as SmolLM2-Instruct writes it (each turn
#: `<|im_start|>role\ncontent<|im_end|>\n`), without a default system turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def tiny_tokenizer(name: str) -> Any:
    """The tokenizer of the text preset `name` made offline, or None for the others: `tiny:llama`'s
    (the README's main job), so its export can be prompted with text and chatted with.

    A byte-level BPE trained on a few fixed English sentences to exactly the preset's vocabulary
    (128 ids, filled up with unused tokens where training made fewer), its special tokens laid out as
    SmolLM2's: `<|endoftext|>` 0 (padding), `<|im_start|>` 1 (the config's BOS), `<|im_end|>` 2 (the
    config's EOS: the end of a turn, where generation stops), and `CHATML_TEMPLATE`. Its alphabet is
    printable ASCII, space and newline: other characters are dropped, and every token decodes to text
    on its own (ExecuTorch's `TextLLMRunner` hands its callback whole strings)."""
    if name.removeprefix("tiny:") != "llama":
        return None
    from transformers import PreTrainedTokenizerFast

    vocab_size = PRESETS["llama"].config["vocab_size"]
    corpus = ["hello, how are you today?", "what is the capital of France?", "the capital of France is Paris.",
              "once upon a time there was a tiny model", "the quick brown fox jumps over the lazy dog"] * 20
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    made = PreTrainedTokenizerFast(tokenizer_object=_byte_level_bpe(corpus, vocab_size, special, newline=True),
                                   bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML_TEMPLATE)
    config = PRESETS["llama"].config
    assert len(made) == vocab_size and made.convert_tokens_to_ids(special) == [0, 1, 2], len(made)
    assert (made.bos_token_id, made.eos_token_id) == (config.get("bos_token_id", 1), config.get("eos_token_id", 2))
    return made


def _byte_level_bpe(corpus: list[str], size: int, special: list[str], *, newline: bool = False) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on `corpus` to `size` tokens (`special` first,
    then the alphabet: printable ASCII and space, with `newline` the newline too), filled up with
    unused special tokens where training made fewer; deterministic for a given corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # byte-level's own characters for a space (0x20 -> U+0120) and a newline (0x0A -> U+010A)
    alphabet = [chr(b) for b in range(33, 127)] + ["\u0120"] + (["\u010a"] if newline else [])
    # no progress bar: the trainer writes blank lines to stdout where it is no terminal (the report's)
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=size, special_tokens=special,
                                                              initial_alphabet=alphabet, show_progress=False))
    tokenizer.add_special_tokens([f"<unused{i}>" for i in range(size - tokenizer.get_vocab_size())])
    return tokenizer


@dataclasses.dataclass(frozen=True)
class SubConfig:
    """A nested config (a multimodal model's vision or text config), built by class name."""

    config_class: str
    kwargs: dict[str, Any]

    def build(self) -> Any:
        """The sub-config object (a vision or text config of a composite model)."""
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
    #: what the model's `generation_config` holds besides what it takes from the config (a
    #: checkpoint's `generation_config.json`: Whisper's prompt and suppressed tokens)
    generation: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
        """The model (weights from `torch.manual_seed(seed)`, in eval mode) and its sample inputs.

        `overrides` replace or add config keyword arguments (`num_hidden_layers=1`, `head_dim=16`).
        """
        import transformers

        kwargs = {key: value.build() if isinstance(value, SubConfig) else value
                  for key, value in {**self.config, **overrides}.items()}
        config = getattr(transformers, self.config_class)(**kwargs)
        torch.manual_seed(seed)
        model = getattr(transformers, self.model_class)(config).eval()
        if self.generation:  # a checkpoint's own generation_config.json, not one derived from its config
            for key, value in self.generation.items():
                setattr(model.generation_config, key, value)
            # transformers 5.24 reads back only its own fields from a file derived from the model config
            model.generation_config._from_model_config = False
        return model, self.inputs(model.config)


def _decoder(name: str, family: str, *, config_class: str | None = None, **config: Any) -> Preset:
    """A causal LM (`<Family>ForCausalLM`) whose config takes the common Llama-style keyword names."""
    return Preset(name, f"{family}ForCausalLM", config_class or f"{family}Config",
                  dict(_TEXT, bos_token_id=1, eos_token_id=2, **config), text_inputs, "decoder", True)


def _encoder(name: str, family: str, **config: Any) -> Preset:
    """A BERT-style text encoder (`<Family>Model`)."""
    base = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=128)
    return Preset(name, f"{family}Model", f"{family}Config", dict(base, **config), text_inputs, "encoder")


def _seq2seq(name: str, model_class: str, config_class: str, **config: Any) -> Preset:
    """A BART-style encoder-decoder."""
    base = dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    return Preset(name, model_class, config_class, dict(base, **config), _seq2seq_inputs, "encoder-decoder", True)


def _speech2text_inputs(config: Any) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {"input_features": torch.randn(1, 32, config.input_feat_per_channel * config.input_channels,
                                          generator=generator),
            "decoder_input_ids": torch.tensor([[config.decoder_start_token_id, 5, 9]])}


def _clip_inputs(config: Any) -> dict[str, torch.Tensor]:
    out = text_inputs(config.text_config)
    out.update(image_inputs(config.vision_config))
    return out


def _ast_inputs(config: Any) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {"input_values": torch.randn(1, config.max_length, config.num_mel_bins, generator=generator)}


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("llama", "LlamaForCausalLM", "LlamaConfig", dict(_TEXT), text_inputs, "decoder", True),
    Preset("qwen3", "Qwen3ForCausalLM", "Qwen3Config", dict(_TEXT, head_dim=8), text_inputs, "decoder", True),
    Preset("gpt2", "GPT2LMHeadModel", "GPT2Config",
           dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2), text_inputs, "decoder", True),
    Preset("mistral", "MistralForCausalLM", "MistralConfig", dict(_TEXT, sliding_window=4, head_dim=8),
           text_inputs, "decoder", True),
    Preset("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
           dict(_TEXT, head_dim=8, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                decoder_sparse_step=1), text_inputs, "decoder", True),
    Preset("mamba", "MambaForCausalLM", "MambaConfig",
           dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                intermediate_size=64), text_inputs, "ssm", True),
    Preset("llava", "LlavaForConditionalGeneration", "LlavaConfig",
           dict(vision_config=SubConfig("CLIPVisionConfig", dict(hidden_size=32, intermediate_size=64,
                                                                 num_hidden_layers=2, num_attention_heads=4,
                                                                 image_size=16, patch_size=4)),
                text_config=SubConfig("LlamaConfig", dict(_TEXT)), image_token_index=120, vision_feature_layer=-1),
           _llava_inputs, "multimodal", True),
    Preset("qwen2_vl", "Qwen2VLForConditionalGeneration", "Qwen2VLConfig",
           dict(text_config=dict(_TEXT, bos_token_id=1, eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                         "mrope_section": [1, 1, 2]}),
                vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=4,
                                   spatial_merge_size=2, temporal_patch_size=2),
                image_token_id=120, video_token_id=121, vision_start_token_id=122, vision_end_token_id=123),
           _qwen2_vl_inputs, "multimodal", True),
    Preset("qwen2_audio", "Qwen2AudioForConditionalGeneration", "Qwen2AudioConfig",
           # at transformers' default 0.02 the tiny model writes the same tokens for a tone and for noise
           # (the audio rows barely move the logits), so no test of the audio path could fail
           dict(audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                                  num_mel_bins=8, max_source_positions=16, init_std=0.1),
                text_config=dict(_TEXT, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1),
                audio_token_id=QWEN2_AUDIO_SPECIAL["<|AUDIO|>"], initializer_range=0.1),
           _qwen2_audio_inputs, "multimodal", True, generation=dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    Preset("bert", "BertModel", "BertConfig",
           dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=128),
           lambda config: text_inputs(config, token_type_ids=True), "encoder"),
    Preset("t5", "T5ForConditionalGeneration", "T5Config",
           # n_positions: T5's checkpoints name their position limit so (t5-small's config.json: 512),
           # here the other presets' 128; ExecuTorch plans a dynamic sequence at it
           dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
                n_positions=128),
           _seq2seq_inputs, "encoder-decoder", True),
    Preset("vit", "ViTForImageClassification", "ViTConfig",
           dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, num_labels=5), image_inputs, "vision"),
    Preset("whisper", "WhisperForConditionalGeneration", "WhisperConfig",
           dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
                max_source_positions=16, max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
                eos_token_id=2, bos_token_id=1, suppress_tokens=WHISPER_SUPPRESS_TOKENS,
                begin_suppress_tokens=WHISPER_BEGIN_SUPPRESS_TOKENS,
                # at the default 0.02 the tiny decoder writes the same tokens whatever the audio (its
                # cross-attention barely moves the logits), so no test of the audio path could fail
                init_std=0.1), whisper_inputs, "encoder-decoder", True,
           generation=WHISPER_GENERATION),
    Preset("wav2vec2", "Wav2Vec2Model", "Wav2Vec2Config",
           dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=2, num_feat_extract_layers=2), audio_inputs, "audio"),
    # -- the coverage panel: more families of each kind (docs/coverage.md) --------------------
    _decoder("qwen2", "Qwen2"),
    _decoder("phi3", "Phi3", pad_token_id=0),
    _decoder("gemma2", "Gemma2", head_dim=8, sliding_window=4),
    _decoder("gemma3_text", "Gemma3", config_class="Gemma3TextConfig", head_dim=8, sliding_window=4, sliding_window_pattern=2),
    _decoder("olmo2", "Olmo2"),
    _decoder("starcoder2", "Starcoder2"),
    _decoder("phi", "Phi"),
    _decoder("smollm3", "SmolLM3", pad_token_id=0),
    _decoder("mixtral", "Mixtral", num_local_experts=4, num_experts_per_tok=2),
    _decoder("olmoe", "Olmoe", num_experts=4, num_experts_per_tok=2),
    Preset("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", dict(_TEXT), text_inputs, "decoder", True),
    Preset("opt", "OPTForCausalLM", "OPTConfig",
           dict(vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=128, word_embed_proj_dim=32, pad_token_id=0), text_inputs, "decoder", True),
    Preset("bloom", "BloomForCausalLM", "BloomConfig",
           dict(vocab_size=128, hidden_size=32, n_layer=2, n_head=4), text_inputs, "decoder", True),
    Preset("falcon", "FalconForCausalLM", "FalconConfig",
           dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
                new_decoder_architecture=True, max_position_embeddings=128), text_inputs, "decoder", True),
    Preset("gptj", "GPTJForCausalLM", "GPTJConfig",
           dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=128, bos_token_id=1,
                eos_token_id=2), text_inputs, "decoder", True),
    Preset("mamba2", "Mamba2ForCausalLM", "Mamba2Config",
           dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                num_heads=8, head_dim=8, n_groups=1, chunk_size=16), text_inputs, "ssm", True),
    Preset("falcon_mamba", "FalconMambaForCausalLM", "FalconMambaConfig",
           dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                intermediate_size=64), text_inputs, "ssm", True),
    _seq2seq("bart", "BartForConditionalGeneration", "BartConfig"),
    _seq2seq("marian", "MarianMTModel", "MarianConfig", decoder_start_token_id=0),
    Preset("speech_to_text", "Speech2TextForConditionalGeneration", "Speech2TextConfig",
           dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=64,
                max_target_positions=32, input_feat_per_channel=8, input_channels=1, conv_channels=16,
                num_conv_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                # at the default 0.02 the tiny model writes the same tokens for every clip, as Whisper's does
                init_std=0.1),
           _speech2text_inputs, "encoder-decoder", True),
    _encoder("roberta", "Roberta", pad_token_id=1),
    _encoder("distilbert", "DistilBert", dim=32, n_layers=2, n_heads=4, hidden_dim=64),
    _encoder("deberta_v2", "DebertaV2"),
    _encoder("modernbert", "ModernBert", global_attn_every_n_layers=2, local_attention=4, pad_token_id=0,
             bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2),
    Preset("convnext", "ConvNextForImageClassification", "ConvNextConfig",
           dict(num_channels=3, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], image_size=32, num_labels=5), image_inputs,
           "vision"),
    Preset("resnet", "ResNetForImageClassification", "ResNetConfig",
           dict(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5, image_size=32),
           image_inputs, "vision"),
    Preset("swin", "SwinForImageClassification", "SwinConfig",
           dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
                num_labels=5), image_inputs, "vision"),
    Preset("dinov2", "Dinov2Model", "Dinov2Config",
           dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64), image_inputs, "vision"),
    Preset("hubert", "HubertModel", "HubertConfig",
           dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=2, num_feat_extract_layers=2), audio_inputs, "audio"),
    Preset("ast", "ASTForAudioClassification", "ASTConfig",
           dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=8,
                num_mel_bins=16, max_length=32, frequency_stride=8, time_stride=8, num_labels=5), _ast_inputs,
           "audio"),
    Preset("clip", "CLIPModel", "CLIPConfig",
           dict(text_config=dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=128, bos_token_id=1, eos_token_id=2),
                vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   image_size=16, patch_size=4), projection_dim=16, bos_token_id=1, eos_token_id=2),
           _clip_inputs, "multimodal"),
]}


def preset_names() -> list[str]:
    """The names of the embedded tiny presets (`tiny:<name>` on the CLI)."""
    return list(PRESETS)


def build_preset(name: str, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Build `tiny:<name>` (the prefix is optional): a random model and its sample inputs.

    `overrides` change the preset's config keyword arguments: `build_preset("llama", 0, num_hidden_layers=1)`.
    """
    key = name.removeprefix("tiny:")
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join('tiny:' + n for n in PRESETS)}")
    return PRESETS[key].build(seed, **overrides)


def sample_inputs(name: str, model: torch.nn.Module) -> dict[str, Any]:
    """Sample inputs for the preset `name`'s model (built from its config)."""
    return PRESETS[name.removeprefix("tiny:")].inputs(model.config)
