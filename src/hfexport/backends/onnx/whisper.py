"""A Whisper generation export as onnxruntime-genai's own Whisper folder (model type `whisper`).

```
out/whisper/                                hfexport export ./whisper-folder -f onnx -o out/whisper
  og_encoder.onnx       input_features -> encoder_hidden_states, output.cache.%d.keys/values (cross K/V)
  og_decoder.onnx       input_ids, input.cache.self_attention.%d.*, input.cache.cross_attention.%d.*
                        -> logits (the suppress lists applied), output.cache.%d.keys/values (self)
  genai_config.json, audio_processor_config.json, tokenizer.json, tokenizer_config.json
  encoder.onnx, prefill.onnx, decode.onnx, config.json, ... (`hfexport generate --audio`)
```
`og.Model(out)`, `model.create_multimodal_processor()(prompt, audios=og.Audios.open(clip))`,
`generator.set_inputs(inputs)` (docs/deploy/onnxruntime-genai.md).

# NOTE: what onnxruntime-genai 0.18.0 runs, read from its source (microsoft/onnxruntime-genai at
# a0c04eb1, whose src/models/whisper.* match the strings of the installed 0.18.0 library:
# whisper.h/.cpp, kv_cache.cpp `CrossCache` and `DefaultKeyValueCache`, whisper_processor.cpp,
# config.h; its builder src/python/py/models/builders/whisper.py for the layout it writes), and its
# feature extractor from onnxruntime-extensions bd0e21c1 (og's cmake/deps.txt pin), read at 319f8d2c:
# shared/api/speech_features.hpp, operators/math/dlib/stft_norm.hpp. `WhisperState` runs the encoder
# once on `audio_features` `[batch, mels, 3000]` (`AudioEncoderState::num_frames_{3000}`, "Whisper
# uses a default value of 3000"; `ValidateWhisperAudioFeaturesShape` refuses any other frame count),
# binding `encoder_hidden_states` `[batch, 1500, encoder.hidden_size]` and, where the encoder has
# them, the cross-attention keys and values `[batch, decoder.num_attention_heads, 1500,
# decoder.head_size]` per decoder layer (`CrossCache`), which it hands the decoder on every step.
# The decoder takes `input_ids` (the whole prompt on the first run, with a self-attention past of
# length 0; one token after), the self past `[batch, num_key_value_heads, past, head_size]` and the
# cross keys and values; no attention mask, no positions: the graph reads the past's length. It
# returns `logits` `[batch, tokens, vocab]` and the self present (`past_present_share_buffer`
# false). Names are `%d` templates of genai_config.json, so hfexport's are given as they are.
# Greedy search takes the argmax of the logits and stops at `eos_token_id` or `max_length`: og has
# no suppress lists (no `suppress` in its src/ but C# `GC.SuppressFinalize`), so the decoder graph
# applies `generate()`'s `suppress_tokens`, and its `begin_suppress_tokens` where the decoder has
# seen the generation config's prompt (`OgWhisperDecoder`). The processor decodes the clip
# (`AudioDecoder`, to 16 kHz), takes a Hann-windowed STFT (`STFTNorm`) and Whisper's Slaney mel
# bank to 8 kHz, log10, clamped to the maximum - 8, (x + 4) / 4 (`LogMelSpectrum`, padding the
# frames to `chunk_size` x 16000 / hop), as transformers' `WhisperFeatureExtractor` does, except
# at the clip's ends: its STFT pads the first frame with zeros where transformers reflects the clip,
# and it pads the clip after the spectrum where transformers pads the samples to 30 s first, so the
# first two frames and the two after a short clip's end differ (a clip padded to 30 s that starts
# with `n_fft / 2` zero samples gets transformers' features to 1e-5; `run_og_whisper` pads the end).
# The export job's runner check therefore compares og's tokens with `generate()`'s on the features
# og's processor computed (`RunnerTokens.features`).
#
# NOTE: why a third decoder and a second encoder rather than og reading `prefill`/`decode`. og feeds
# one decoder graph the prompt (several tokens, empty past) and then one token at a time (a past),
# where `decode` takes one token and `prefill` no past; and its encoder session must output the
# cross-attention keys and values, which `prefill` computes from the encoder's output. Recomputing
# them per token from `encoder_hidden_states` (og's other layout) costs two matmuls per layer over
# 1500 positions a token, 3.5 GFLOP a token for whisper-tiny. So the folder gets og's two graphs
# besides the components, as OpenVINO's folder gets WhisperPipeline's decoder (`openvino/whisper.py`):
# the encoder's weights are written twice, the decoder's three times.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OG_GRAPHS", "OG_FRAMES", "OG_SAMPLING_RATE", "OgWhisperEncoder", "OgWhisperDecoder",
           "og_whisper_components", "og_whisper_refusal", "og_extractor_refusal"]

#: the components og's `genai_config.json` names: its encoder and decoder sessions
OG_GRAPHS = ("og_encoder", "og_decoder")
#: the feature frames onnxruntime-genai 0.18's Whisper takes, whatever the model (whisper.h)
OG_FRAMES = 3000
#: onnxruntime-genai 0.18's feature extractor's rate: its `LogMel` fixes `n_sr_{16000}`, its
#: `AudioDecoder` resamples every clip to it (speech_features.hpp, audio_decoder.h)
OG_SAMPLING_RATE = 16000
_SEEN = "onnxruntime-genai 0.18.0"


class OgWhisperEncoder(torch.nn.Module):
    """Whisper's encoder as og's encoder session: `input_features` -> `{"encoder_hidden_states",
    "cache"}`, the cache holding each decoder layer's cross-attention keys and values, computed by
    the model's own decoder on its start token (only the cross-attention projections reach the
    outputs; the rest is dead code the export drops)."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model
        self.start = int(model.config.decoder_start_token_id)

    def forward(self, input_features):
        """The encoder's output and the cross-attention cache the decoder reads it through."""
        from transformers import DynamicCache, EncoderDecoderCache

        hidden = self.model.get_encoder()(input_features=input_features).last_hidden_state
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        start = torch.full((input_features.shape[0], 1), self.start, dtype=torch.long, device=input_features.device)
        self.model(decoder_input_ids=start, encoder_outputs=(hidden,), past_key_values=cache, use_cache=True)
        return {"encoder_hidden_states": hidden, "cache": cache.cross_attention_cache}


class OgWhisperDecoder(torch.nn.Module):
    """Whisper's decoder and head as og's decoder session: `input_ids` after the cache
    `past_key_values` (self-attention past, possibly empty, and the encoder's cross-attention keys
    and values) -> `{"logits", "cache"}` (the self-attention present).

    The logits are `generate()`'s scores for greedy search: `suppress_tokens` at -inf, and
    `begin_suppress_tokens` too where the decoder has now seen `prompt_length` tokens (the first
    token after the generation config's decoder prompt), which og 0.18 does not apply itself."""

    def __init__(self, model: Any, suppress: list[int], begin_suppress: list[int], prompt_length: int):
        super().__init__()
        self.model = model
        vocab = int(model.config.vocab_size)
        self.register_buffer("suppress", _mask(suppress, vocab), persistent=False)
        self.register_buffer("begin_suppress", _mask(begin_suppress, vocab), persistent=False)
        self.prompt_length = int(prompt_length)
        self.width = int(model.config.d_model)

    def forward(self, input_ids, past_key_values):
        """The suppressed logits of every new token and the self-attention cache with them."""
        # the cross-attention layers read the cache (its keys are set); they only ask that an encoder output be given
        weight = self.model.get_output_embeddings().weight
        given = torch.zeros(input_ids.shape[0], 1, self.width, dtype=weight.dtype, device=input_ids.device)
        out = self.model(decoder_input_ids=input_ids, encoder_outputs=(given,), past_key_values=past_key_values,
                         use_cache=True)
        cache = past_key_values.self_attention_cache
        # past + new tokens, as a tensor: a graph of the symbolic length, not a Python bool the capture would fix
        seen = torch.ones(cache.layers[0].keys.shape[-2], dtype=torch.int64, device=input_ids.device).sum()
        banned = self.suppress | (self.begin_suppress & (seen == self.prompt_length))
        return {"logits": out.logits.masked_fill(banned, float("-inf")), "cache": cache}


def _mask(tokens: list[int], vocab: int) -> torch.Tensor:
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[[t for t in tokens if 0 <= t < vocab]] = True
    return mask


def og_whisper_components(model: Any, components: dict[str, Any], generation_config: Any) -> dict[str, Any]:
    """The two graphs og's Whisper runs besides `components` (a Whisper's, from
    `decompose_for_generation`): `og_encoder` on the sample's features, and `og_decoder` on 3 new
    tokens after the decoder prompt's cache (so the token and past axes both stay symbolic), with
    `generation_config`'s suppress lists."""
    from transformers import DynamicCache, EncoderDecoderCache

    from ...generation.decoder_prompt import DETECT_LANGUAGE, decoder_prompt

    encoder = OgWhisperEncoder(model)
    features = components["encoder"][1]["input_features"]
    prompt = decoder_prompt(generation_config, model.config)
    decoder = OgWhisperDecoder(model, list(getattr(generation_config, "suppress_tokens", None) or []),
                               list(getattr(generation_config, "begin_suppress_tokens", None) or []), len(prompt))
    ids = torch.tensor([[t for t in prompt if t != DETECT_LANGUAGE]]).expand(features.shape[0], -1)
    with torch.no_grad():
        cross = encoder(features)["cache"]
        cache = EncoderDecoderCache(DynamicCache(), cross)
        decoder(ids, cache)
    new = (torch.arange(3) * 7 + 3).remainder(int(model.config.vocab_size))[None].expand(features.shape[0], -1)
    return {"og_encoder": (encoder, {"input_features": features}),
            "og_decoder": (decoder, {"input_ids": new, "past_key_values": cache})}


def og_whisper_refusal(model_config: Any, generation_config: Any, config: Any) -> str | None:
    """Why onnxruntime-genai 0.18 cannot run a Whisper folder of this model with `generate()`'s
    tokens (its `model_config`, the generation config it is saved with, the export's `config`), or None."""
    from ...errors import PrepareError
    from ...generation.decoder_prompt import decoder_prompt

    model_type = getattr(model_config, "model_type", None)
    if model_type != "whisper":
        return (f"onnxruntime-genai's speech model type is whisper; model_type {model_type!r} keeps the components, "
                "which `hfexport generate --audio` runs")
    frames = 2 * int(model_config.max_source_positions)
    if frames != OG_FRAMES:
        # onnxruntime-genai src/models/whisper.h (0.18.0): `int num_frames_{3000};  // Whisper uses a default value
        # of 3000`, and ValidateWhisperAudioFeaturesShape: "Whisper uses num_frames = 3000. The provided inputs
        # have num_frames = N"; no config field sets it
        return (f"{_SEEN}'s Whisper feeds the encoder {OG_FRAMES} feature frames whatever the model (whisper.h: "
                "`int num_frames_{3000}`, and ValidateWhisperAudioFeaturesShape refuses other audio_features), "
                f"where this encoder takes 2 x max_source_positions = {frames}; `hfexport generate --audio` runs "
                "the folder")
    if not getattr(config, "dynamic", False) and getattr(config, "dynamic_shapes", None) is None:
        return ("a static export: onnxruntime-genai feeds its decoder the prompt, then one token at a time, over a "
                "growing past; export with dynamic=True")
    if generation_config is None:
        return "no generation config: og's decoder needs the decoder prompt and end token of generation_config.json"
    if getattr(generation_config, "return_timestamps", False):
        return ("the generation config asks for timestamps (return_timestamps), which need Whisper's timestamp logits "
                f"processor; {_SEEN} has none")
    try:
        decoder_prompt(generation_config, model_config)
    except PrepareError as error:
        return f"the decoder prompt cannot be built from the generation config: {error}"
    return None


def og_extractor_refusal(model_config: Any, extractor: Any) -> str | None:
    """Why og's own feature extractor (the `audio_processor_config.json` written from `extractor`)
    would not compute `extractor`'s log-mel features, or None (see the module note)."""
    name = type(extractor).__name__
    if name != "WhisperFeatureExtractor":
        return f"the feature extractor is a {name}; onnxruntime-genai computes Whisper's log-mel features itself"
    if getattr(extractor, "dither", 0.0):
        return f"the feature extractor dithers (dither={extractor.dither}); onnxruntime-genai's features add no noise"
    if int(extractor.sampling_rate) != OG_SAMPLING_RATE:
        return (f"the feature extractor's rate is {extractor.sampling_rate} Hz; onnxruntime-genai's decodes every clip "
                f"to {OG_SAMPLING_RATE} Hz and its mel bank is for that rate (speech_features.hpp `n_sr_{{16000}}`)")
    if int(extractor.feature_size) != int(model_config.num_mel_bins):
        return (f"the feature extractor makes {extractor.feature_size} mel bins where the encoder takes "
                f"{model_config.num_mel_bins}")
    if int(extractor.n_samples) // int(extractor.hop_length) != OG_FRAMES or int(extractor.n_samples) != int(
            extractor.chunk_length) * OG_SAMPLING_RATE:
        return (f"the feature extractor makes {extractor.n_samples // extractor.hop_length} frames of "
                f"{extractor.chunk_length} s chunks where onnxruntime-genai's Whisper takes {OG_FRAMES}")
    return None
