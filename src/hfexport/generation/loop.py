"""`GenerationRunner`: generate from a saved export by driving its components, like `generate()`.

```python
from hfexport import GenerationRunner

runner = GenerationRunner.load("out/tiny-llama")          # written by `hfexport export --generate`
result = runner.generate([1, 2, 3], max_new_tokens=16)    # greedy: the tokens of generate(do_sample=False)
result.tokens, result.time_to_first_token_s, result.tokens_per_s
```

# NOTE: the runner knows no model class. Each component's inputs are filled by name from what
# the loop holds (new token ids, positions, masks, the cache leaves the last call returned, the
# encoder's hidden states), which is the same for every architecture the exporters support:
#   - dynamic cache: `prefill` on the prompt, then `decode` one token at a time, the cache leaves
#     each call returns (`cache.<layer>.<tensor>`) fed to the next;
#   - static cache (`cache_implementation="static"` + `multi_token_decode`): the one `decode`
#     graph takes the whole prompt on an empty cache, then one token per call, with the documented
#     boolean causal mask `[1, 1, q, attended]`: over the slots written so far (cached + q) where
#     the program's attention follows the mask (`generation/attended.py`), else over the whole
#     cache; the cache starts as zeros of the recorded shapes and its write counters come back
#     with every call;
#   - OpenVINO's one stateful model (`backends/openvino/genai.py`): no `prefill`; `decode` takes the
#     prompt on the reset (empty) state, then one token per call, with the 2-D mask over cached +
#     new tokens; the state grows inside the runtime, bounded at `max_cache_len` where recorded;
#   - cache inside the program (ExecuTorch's LLM-runner program, the default of `--format executorch
#     --static-cache N`): `decode` takes the new tokens and `input_pos`, where they go; the program
#     keeps its cache between calls;
#   - encoder-decoder: the `encoder` first, its `last_hidden_state` fed to every decoder call; the
#     decoder starts from the prompt its generation config names (`decoder_prompt.py`: the start
#     token, and a speech model's language, task and no-timestamps tokens, as Whisper's `generate`).
# The next token is chosen with transformers' own logits processors (repetition penalty, minimum
# length, temperature, top-k, top-p), so sampling means what it means in `generate()`. Plain
# greedy decoding (no processor, no per-step logits) on a program holding its cache runs its
# decode steps in `greedy.GreedySteps`, the feed bound once (`GenerationResult.fast_path`).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..errors import ExportError, PrepareError
from ..folder.engine import open_engine, route, run_on_engine
from ..folder.generation_export import GenerationExport
from .audio_input import AUDIO_INPUT_NAMES
from .decoder_prompt import DETECT_LANGUAGE, check_decoder_length, decoder_prompt, detected_language
from .greedy import GreedySteps
from .multimodal import AudioPrefill, ImagePrefill
from .result import GenerationResult, as_token_list

__all__ = ["GenerationRunner", "GenerationResult"]

_MULTIMODAL = ("image_encoder", "audio_encoder", "language_model")


class _ComponentRunners(Mapping):
    """`name -> runner` of an export's components, each opened at its first use, `decode` at once
    (so a folder its runtime cannot open fails at `load`, as before). A folder may hold models that
    a runtime's own pipeline runs and `hfexport generate` does not (VLMPipeline's language model,
    MultimodalRunner's program: each holds the language model's weights again), which are then
    never loaded."""

    def __init__(self, components: dict[str, Any], *, open_decode: bool = True):
        self._components = components
        self._open: dict[str, Any] = {}
        if open_decode and "decode" in components:  # not where the runtime's engine runs it (opened at its first use)
            self._open["decode"] = components["decode"].runner()

    def __getitem__(self, name: str) -> Any:
        if name not in self._open:
            self._open[name] = self._components[name].runner()
        return self._open[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._components)

    def __len__(self) -> int:
        return len(self._components)


class GenerationRunner:
    """Drives the components of a generation export (see the module docstring).

    Args:
        export: a loaded export (`GenerationExport.load(dir)`); `GenerationRunner.load(dir)` does both.
        engine: what generates where it can (`engine.ENGINE_CHOICES`): `"auto"` the runtime's own
            engine on a runtime's LLM package where it is installed and the options allow
            (`engine.py`), else hfexport's loop; `"runtime"` the engine or an `EngineRefused`;
            `"hfexport"` hfexport's loop.

    Attributes:
        engine: the runtime's engine opened on the folder (`engine.LlmEngine`), or None.
        engine_reason: why there is none (None where `engine="hfexport"` was asked).
    """

    def __init__(self, export: GenerationExport, *, engine: str = "auto"):
        self.export = export
        names = set(export.components)
        if names & set(_MULTIMODAL) and not ({"image_encoder", "text_embeddings"} <= names
                                             or {"audio_encoder", "text_embeddings"} <= names):
            raise ExportError(
                f"{export.directory} holds multimodal components ({', '.join(sorted(names))}); the runner drives "
                "text decoders, encoder-decoders, and image-text and audio-text models exported with a "
                "text_embeddings component",
                remedy="export the model with `hfexport export MODEL --generate` (export_to_folder), whose "
                "folder adds text_embeddings to the documented components, or from Python export "
                "decompose_for_generation(model, inputs, runner_components=True) with exporter.export_components",
            )
        if "decode" not in names:
            raise ExportError(f"{export.directory} has no 'decode' component", remedy="export with --generate")
        self.engine_choice = engine
        self.engine, self.engine_reason = open_engine(export, engine)
        self.runners = _ComponentRunners(export.components, open_decode=self.engine is None)
        self.records = {name: component.record for name, component in export.components.items()}
        self.static = export.manifest.get("cache") == "static"
        decode_inputs = dict(zip(self.records["decode"].input_names, self.records["decode"].input_shapes))
        decode_ids = decode_inputs.get("input_ids", decode_inputs.get("decoder_input_ids"))  # an encoder-decoder's
        self.decode_takes_one = bool(decode_ids) and decode_ids[-1] == 1  # one new token per decode call
        # a static cache's length, or the bound of an OpenVINO state that grows (`OpenVINOConfig.max_cache_len`)
        self.max_cache_len = export.manifest.get("max_cache_len") or next(
            (r.details["state"]["max_cache_len"] for r in self.records.values()
             if (r.details.get("state") or {}).get("max_cache_len")), None)
        self.initial_cache = export.manifest.get("initial_cache", {})
        self._fed: dict[str, list] = {}  # `fed_inputs`, per component
        self._attends: dict[tuple, bool] = {}  # `attends_written_slots`, per record and mask shape
        self.use_fast_path = True  # greedy decode steps through `greedy.GreedySteps` where they can run
        self.image_prefill = ImagePrefill(self) if "image_encoder" in names else None
        #: an audio-text LLM's prefill (Qwen2-Audio's): the clip's rows merged at the audio tokens
        self.audio_prefill = AudioPrefill(self) if "audio_encoder" in names else None
        # a speech encoder-decoder (Whisper): its encoder takes the feature extractor's `input_features`
        self.is_speech = "encoder" in names and any(
            name in AUDIO_INPUT_NAMES for name in self.records["encoder"].input_names)
        self._processor = None  # the saved processor, loaded at the first `generate_from_image` or `_audio`

    # NOTE: read once per component, not per step: a decode step's own Python work is what
    # `hfexport generate` adds to the runtime's (`bench/genai_decode.py`, `bench/onnx_genai.py`
    # compare it with the vendors' C++ loops on the same folder).
    def fed_inputs(self, name: str) -> list[tuple[str, Any, str]]:
        """`(name, shape, dtype)` of the inputs the loop fills for component `name` (not its cache)."""
        if name not in self._fed:
            record = self.records[name]
            self._fed[name] = [entry for entry in zip(record.input_names, record.input_shapes,
                                                      record.input_dtypes or [""] * len(record.input_names))
                               if not entry[0].startswith("cache.")]
        return self._fed[name]

    def attends_written_slots(self, record, mask_shape) -> bool:
        """`_attends_written_slots`, remembered per record and mask shape."""
        key = (id(record), tuple(mask_shape))
        if key not in self._attends:
            self._attends[key] = _attends_written_slots(record, mask_shape)
        return self._attends[key]

    @classmethod
    def load(cls, directory: str | os.PathLike, *, verify: bool = True, engine: str = "auto") -> GenerationRunner:
        """Open the export in `directory` (written by `hfexport export --generate` or
        `hfexport.save_folder`); `verify=False` skips the SHA-256 check of its files
        (`GenerationExport.load`); `engine` as the class takes it."""
        return cls(GenerationExport.load(directory, verify=verify), engine=engine)

    # -- generation ---------------------------------------------------------------------------

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int = 16,
        *,
        min_new_tokens: int = 0,
        do_sample: bool = False,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        eos_token_id: int | list[int] | None = -1,
        attention_mask: torch.Tensor | None = None,
        output_logits: bool = False,
        streamer: Any = None,
        **encoder_inputs: Any,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens` after the prompt `input_ids` (one sequence).

        Greedy by default: the tokens equal `model.generate(input_ids, do_sample=False,
        max_new_tokens=...)`. Options not given come from the saved generation config.

        Args:
            input_ids: the prompt, a list of ints or a `[1, n]` tensor (the encoder's input for an
                encoder-decoder model).
            eos_token_id: stop after this token; default: the generation config's; `None` never stops early.
            attention_mask: the prompt's mask for an encoder-decoder's encoder (default all ones).
            output_logits: also return each step's raw logits (before the processors), as
                `generate(output_logits=True)` does.
            streamer: an object with `put(ids)` and `end()`, called as `generate()` calls its
                streamer: `put` with the prompt first, then with each new token as it is chosen
                (`transformers.TextStreamer(tokenizer, skip_prompt=True)` prints the answer as it comes).
            encoder_inputs: other encoder inputs by name (`input_features=` for speech models; for an
                image-text export the processor's image inputs, `pixel_values=` and Qwen2-VL's
                `image_grid_thw=`, with the image tokens in `input_ids`: `multimodal.py`; for an
                audio-text export the processor's `input_features=` and `feature_attention_mask=`, with
                the audio tokens in `input_ids`).
        """
        start = time.perf_counter()
        prompt = _as_prompt(input_ids)
        config = self.generation_config(max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p,
                                        repetition_penalty, eos_token_id)
        request, why = route(self, config, prompt[0].tolist(), output_logits=output_logits,
                             encoder_inputs=bool(encoder_inputs) or attention_mask is not None)
        if request is not None:
            ids = prompt[0].tolist()
            return run_on_engine(self, self.engine.conversation(keep=False), ids, 0, request, streamer=streamer,
                                 start=start)
        state = DecodeState(self, prompt, attention_mask, encoder_inputs)
        prefix = state.decoder_prefix()
        if state.is_seq2seq:
            check_decoder_length(prefix.shape[1], config.max_new_tokens, self.export.config)
        result = self._generate_on(state, prefix[:, len(state.fed):], prefix, config, seed=seed,
                                   output_logits=output_logits, streamer=streamer, start=start)
        result.prompt = prompt[0].tolist()  # an encoder-decoder's is the encoder's input, not the decoder's start
        result.engine_reason = why
        return result

    def processor(self) -> Any:
        """The processor saved with the export (`GenerationExport.load_processor`), loaded at the
        first call; None where the export holds none."""
        if self._processor is None and self.export.has_processor:
            self._processor = self.export.load_processor()
        return self._processor

    def generate_from_image(self, image: Any, prompt: str, max_new_tokens: int = 16, **options: Any) -> GenerationResult:
        """Generate from an image and a text prompt with the processor saved in the export: `image`
        is a path or a `PIL.Image.Image`, `prompt` the user's text, formatted with the processor's
        chat template where it has one (`image_input.prompt_text`). `options` are `generate`'s.
        Greedy tokens equal `model.generate(**processor(images=..., text=...), do_sample=False)`'s.

        Raises:
            ExportError: the export is not an image-text model's, or holds no processor.
            ImportError: Pillow (or a package transformers needs for the processor) is missing.
        """
        from .image_input import image_prompt_inputs

        if self.image_prefill is None:
            raise ExportError(f"{self.export.directory} is not an image-text export (it has no image_encoder)",
                              remedy="generate from it with a text prompt (input_ids), or export an image-text model")
        processor = self.processor()
        if processor is None:
            raise ExportError(f"{self.export.directory} holds no processor to read an image with",
                              remedy="pass the processor's arrays to generate() (pixel_values=...), or export again "
                              "from a model folder that has its processor (processor_config.json)")
        inputs = image_prompt_inputs(processor, image, prompt)
        return self.generate(inputs.pop("input_ids"), max_new_tokens, **options, **inputs)

    def generate_from_audio(self, audio: Any, max_new_tokens: int = 16, *, prompt: str | None = None,
                            sampling_rate: int | None = None, **options: Any) -> GenerationResult:
        """Generate from a speech clip with the processor saved in the export: `audio` is a file
        (wav, flac: `audio_input.read_audio`) or an array of samples at `sampling_rate` (default: the
        feature extractor's), mixed to mono and resampled as a file is. `options` are `generate`'s;
        `result.text` is the transcript (the answer).

        A speech encoder-decoder (Whisper) takes the clip alone: greedy tokens equal
        `model.generate(input_features=feature_extractor(clip)["input_features"], do_sample=False)`'s.
        An audio-text LLM (Qwen2-Audio) takes `prompt` too (default `audio_input.DEFAULT_AUDIO_PROMPT`),
        formatted with the processor's chat template (`audio_input.audio_prompt_text`): greedy tokens
        equal `model.generate(**processor(text=..., audio=...), do_sample=False)`'s.

        Raises:
            PrepareError: the export is not a speech model's or holds no feature extractor, a prompt
                given to a speech encoder-decoder, the file cannot be read, or the clip is longer
                than the feature extractor's chunk.
            ImportError: soundfile or scipy is missing (`pip install "hfexport[audio]"`).
        """
        from .audio_input import audio_features, audio_prompt_inputs

        if not self.takes_audio:
            raise PrepareError(f"{self.export.directory} is not a speech export (its components take no "
                               "input_features)", remedy="generate from it with a text prompt, or export a speech "
                               "model (hfexport export tiny:whisper --generate, tiny:qwen2_audio)")
        if prompt is not None and self.is_speech:
            raise PrepareError(f"{self.export.directory} is a speech encoder-decoder's export: it takes the clip alone",
                               remedy="drop the prompt (the decoder's prompt comes from the saved generation config)")
        processor = self.processor()
        if getattr(processor, "feature_extractor", None) is None:
            raise PrepareError(f"{self.export.directory} holds no feature extractor to read audio with",
                               remedy="pass the feature extractor's arrays to generate() (input_features=...), or "
                               "export again from a model folder that has its processor (preprocessor_config.json)")
        if self.is_speech:
            return self.generate([], max_new_tokens, **options, **audio_features(processor, audio, sampling_rate))
        inputs = audio_prompt_inputs(processor, audio, prompt, sampling_rate)
        return self.generate(inputs.pop("input_ids"), max_new_tokens, **options, **inputs)

    @property
    def takes_audio(self) -> bool:
        """Whether the export generates from audio: a speech encoder-decoder (`is_speech`) or an
        audio-text LLM (`audio_prefill`)."""
        return self.is_speech or self.audio_prefill is not None

    def _generate_on(self, state: DecodeState, new_ids: torch.Tensor, sequence: torch.Tensor, config: Any, *,
                     seed: int | None = None, output_logits: bool = False, streamer: Any = None,
                     start: float | None = None) -> GenerationResult:
        """Feed `new_ids` to `state` (whose cache holds the rest of `sequence`) and generate as
        `config` says: the loop of `generate`, on a state a caller may keep between calls (a chat's
        conversation, `chat.ChatSession`). Returns what `generate` returns, `prompt` being `sequence`."""
        start = time.perf_counter() if start is None else start
        eos = as_token_list(config.eos_token_id)
        processors = _logits_processors(config, eos)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        is_plain_greedy = self.use_fast_path and not (config.do_sample or processors or output_logits)
        if streamer is not None:
            streamer.put(sequence)
        prompt = sequence[0].tolist()
        tokens: list[int] = []
        raw_logits: list[torch.Tensor] = []
        step_ids = new_ids
        first_at = None
        fast = None
        while len(tokens) < config.max_new_tokens:
            logits = state.step(step_ids)
            if output_logits:
                raw_logits.append(logits[:, -1].float().clone())
            scores = processors(sequence, logits[:, -1].float()) if processors else logits[:, -1].float()
            if config.do_sample:
                next_token = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)
            else:
                next_token = scores.argmax(-1, keepdim=True)
            token = int(next_token)
            tokens.append(token)
            sequence = torch.cat([sequence, next_token], dim=1)
            step_ids = next_token
            if streamer is not None:
                streamer.put(next_token[0])
            if first_at is None:
                first_at = time.perf_counter()
            if token in eos:
                break
            if is_plain_greedy and len(tokens) == 1 < config.max_new_tokens:  # the decode steps, where they can
                fast = GreedySteps.of(state, config.max_new_tokens - 1)
                if fast is not None:
                    fast.run(tokens, config.max_new_tokens, frozenset(eos), streamer)
                    break
        if streamer is not None:
            streamer.end()
        end = time.perf_counter()
        decoded = len(tokens) - 1
        def text(export=self.export, tokens=tuple(tokens)) -> str | None:
            tokenizer = export.tokenizer
            return tokenizer.decode(list(tokens), skip_special_tokens=True) if tokenizer is not None else None

        return GenerationResult(
            tokens=tokens,
            prompt=prompt,
            time_to_first_token_s=(first_at or end) - start,
            tokens_per_s=decoded / (end - first_at) if decoded > 0 and end > first_at else float("nan"),
            _text=text,
            logits=raw_logits if output_logits else None,
            stopped_at_eos=bool(tokens) and tokens[-1] in eos,
            fast_path=fast is not None,
        )

    def score(self, input_ids: Any, tokens: list[int], **encoder_inputs: Any) -> list[torch.Tensor]:
        """Teacher-forced logits: the last position's raw logits after the prompt, then after each
        of `tokens` fed in turn; entry `i` is what the export predicts for `tokens[i]` (`len(tokens)`
        entries). What an accuracy check compares with eager, free of the drift a free-running
        loop accumulates after its first differing token."""
        state = DecodeState(self, _as_prompt(input_ids), None, encoder_inputs)
        prefix, logits = state.decoder_prefix(), []
        step_ids = prefix[:, len(state.fed):]
        for token in tokens:
            logits.append(state.step(step_ids)[0, -1].float().clone())
            step_ids = torch.tensor([[int(token)]])
        return logits

    def generation_config(self, max_new_tokens: int = 16, min_new_tokens: int = 0, do_sample: bool = False,
                          temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                          repetition_penalty: float | None = None, eos_token_id: Any = -1) -> Any:
        """The saved generation config with the options of `generate` on top (those not `None`;
        `eos_token_id=-1` keeps the saved end tokens)."""
        from transformers import GenerationConfig

        base = self.export.generation_config
        config = copy.deepcopy(base) if base is not None else GenerationConfig()
        updates = {"max_new_tokens": max_new_tokens, "min_new_tokens": min_new_tokens, "do_sample": do_sample,
                   "temperature": temperature, "top_k": top_k, "top_p": top_p,
                   "repetition_penalty": repetition_penalty}
        for key, value in updates.items():
            if value is not None:
                setattr(config, key, value)
        if eos_token_id != -1:
            config.eos_token_id = eos_token_id
        return config


class DecodeState:
    """What the loop carries between calls: cache leaves, the number of tokens already in the
    cache, the encoder's outputs."""

    def __init__(self, runner: GenerationRunner, prompt: torch.Tensor, attention_mask, encoder_inputs):
        self.runner = runner
        self.prompt = prompt
        self.cache: dict[str, torch.Tensor] = {}  # the cache leaves while no session holds them
        self.session = None  # (component name, CacheSession) of the component last run
        self.length: int | None = None  # a static cache's length, read from its buffers
        self.past = 0
        self.fed: list[int] = []  # the decoder tokens the cache holds, in order
        self.first = True
        self.encoder_hidden: torch.Tensor | None = None
        self.rope_delta = 0  # M-RoPE: what the decode steps add to their text position (`multimodal.py`)
        self.prompt_mask = attention_mask if attention_mask is not None else torch.ones_like(prompt)
        self.encoder_inputs = dict(encoder_inputs)
        self.is_seq2seq = "encoder" in runner.runners
        if self.is_seq2seq:
            self._run_encoder()

    def decoder_prefix(self) -> torch.Tensor:
        """The first decoder tokens: the prompt, or an encoder-decoder's decoder prompt (its start
        token, and a speech model's prompt tokens: `decoder_prompt`). A language to detect is picked
        here from the decoder's logits after the start token, which the cache then holds (`fed`)."""
        if not self.is_seq2seq:
            return self.prompt
        generation_config = self.runner.export.generation_config
        prompt = decoder_prompt(generation_config, self.runner.export.config)
        if DETECT_LANGUAGE in prompt:
            logits = self.step(torch.tensor([prompt[:1]]))
            prompt[prompt.index(DETECT_LANGUAGE)] = detected_language(logits[0, -1], generation_config)
        return torch.tensor([prompt])

    def _run_encoder(self) -> None:
        runner = self.runner.runners["encoder"]
        feed = {}
        for name, shape in zip(runner.record.input_names, runner.record.input_shapes):
            if name == "input_ids":
                feed[name] = self.prompt
            elif name == "attention_mask":
                feed[name] = self.prompt_mask
            elif name in self.encoder_inputs:
                feed[name] = torch.as_tensor(self.encoder_inputs[name])
                if len(shape) != feed[name].dim() or any(isinstance(size, int) and size != given
                                                         for size, given in zip(shape, feed[name].shape)):
                    raise PrepareError(f"the encoder takes {name} of shape {list(shape)}, got {list(feed[name].shape)}",
                                       remedy="make it with the processor saved in the export (a speech model's "
                                       "feature extractor pads every clip to its chunk)")
            else:
                raise PrepareError(f"the encoder takes {name!r}", remedy=f"pass {name}=... to generate()")
        outputs = runner.run_named(feed)
        self.encoder_hidden = outputs.get("last_hidden_state", next(iter(outputs.values())))

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Run the next component on the new tokens `ids`; return its logits (those of the last
        call when a `decode` that takes one token at a time is fed several, after a `rewind`)."""
        if self.first and (self.runner.image_prefill or self.runner.audio_prefill) is not None:
            return self._image_prefill(ids)
        name = "prefill" if self.first and "prefill" in self.runner.runners else "decode"
        if name == "decode" and not self.first and ids.shape[1] > 1 and self.runner.decode_takes_one:
            for index in range(ids.shape[1]):
                logits = self.step(ids[:, index:index + 1])
            return logits
        runner = self.runner.runners[name]
        record = runner.record
        if self.first:
            self._init_cache(record)
        feed = {input_name: self._value(record, input_name, shape, dtype, ids)
                for input_name, shape, dtype in self.runner.fed_inputs(name)}
        bound = self.runner.max_cache_len
        if not self.runner.static and bound is not None and self.past + ids.shape[1] > bound:
            raise ExportError(f"{self.past + ids.shape[1]} tokens do not fit the export's cache, bounded at {bound} tokens",
                              remedy="export with a larger max_cache_len (--static-cache N), or generate fewer tokens")
        outputs = self._session(name, runner).run(feed)
        self.past += ids.shape[1]
        self.fed += ids[0].tolist()
        self.first = False
        return outputs["logits"]

    def _image_prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """The first call of an image-text (audio-text) export: `multimodal.ImagePrefill` (`AudioPrefill`),
        whose cache the decode takes on."""
        prefill = self.runner.image_prefill or self.runner.audio_prefill
        logits, self.cache, self.rope_delta = prefill.run(ids, self.encoder_inputs)
        self.past, self.fed, self.first = ids.shape[1], ids[0].tolist(), False
        return logits

    def rewind(self, length: int) -> str | None:
        """Cut the cache back to the first `length` tokens it holds, so the next `step` continues
        after them (a chat's next turn reuses what the conversation so far computed); return why
        it cannot, the state unchanged, or None when done.

        A static cache keeps its slots and is only told to write from `length` on again (its
        write counters, `cache.<layer>.cumulative_length`); a dynamic cache's keys and values are
        cut to `length` entries. A cache of any other shape (a sliding window, a recurrent state)
        cannot be cut back to a token."""
        if self.is_seq2seq:
            return "an encoder-decoder's decoder cache depends on its encoder's input"
        if not 0 < length <= self.past:
            return f"it holds {self.past} tokens, not a prefix of {length}"
        cache = self.session[1].cache() if self.session is not None else dict(self.cache)
        cut = {}
        for name, value in cache.items():
            kind = name.rsplit(".", 1)[-1]
            if self.runner.static and kind == "cumulative_length":
                cut[name] = torch.full_like(value, length)
            elif kind in ("keys", "values") and value.dim() == 4 and value.shape[2] == (
                    self._cache_length() if self.runner.static else self.past):
                cut[name] = value if self.runner.static else value[:, :, :length].contiguous()
            else:
                return (f"its cache leaf {name!r} (shape {list(value.shape)}) does not hold one entry per token "
                        "(a sliding window or a recurrent state)")
        self.cache, self.session = cut, None
        self.past, self.fed = length, self.fed[:length]
        return None

    def _session(self, name: str, runner) -> Any:
        """The cache session of component `name`; switching components hands the cache over."""
        if self.session is not None and self.session[0] != name:
            self.cache = self.session[1].cache()
            self.session = None
        if self.session is None:
            empty = getattr(runner, "starts_empty", False)  # an OpenVINO state that grows from empty
            missing = [n for n in runner.record.input_names if n.startswith("cache.") and n not in self.cache and not empty]
            if missing:
                raise ExportError(f"no value for cache inputs {missing} (the previous call did not return them)",
                                  remedy="export the components again with this version of hfexport")
            if self.runner.static:
                self._cache_length()
            self.session = (name, runner.cache_session(self.cache))
            self.cache = {}  # the session holds them now
        return self.session[1]

    def _init_cache(self, record) -> None:
        """The empty cache the first call takes: recorded small leaves (window sizes, write
        counters at 0), zeros for a static cache's key/value buffers."""
        for name, shape, dtype in zip(record.input_names, record.input_shapes, record.input_dtypes):
            if not name.startswith("cache."):
                continue
            if name in self.runner.initial_cache:
                self.cache[name] = torch.tensor(self.runner.initial_cache[name], dtype=getattr(torch, dtype))
            elif self.runner.static:
                self.cache[name] = _zeros(self._concrete(shape), getattr(torch, dtype or "float32"))

    def _concrete(self, shape) -> list[int]:
        """A recorded shape with its symbolic axes resolved: a static cache's length is `max_cache_len`."""
        if any(isinstance(d, str) for d in shape) and not self.runner.max_cache_len:
            raise ExportError("the export does not record max_cache_len", remedy="export again with hfexport")
        return [int(d) if not isinstance(d, str) else int(self.runner.max_cache_len) for d in shape]

    def _value(self, record, name: str, shape, dtype: str, ids: torch.Tensor) -> torch.Tensor:
        q = ids.shape[1]
        if name in ("input_ids", "decoder_input_ids"):
            return ids
        positions = torch.arange(self.past, self.past + q)
        if name in ("position_ids", "decoder_position_ids"):
            if len(shape) == 3:  # M-RoPE's `[4, batch, q]`: the text position, then three rows shifted by the delta
                return torch.stack([positions[None], *[positions[None] + self.rope_delta] * (shape[0] - 1)])
            return positions[None]
        if name == "mm_token_type_ids":  # a decode step's new tokens are text
            return torch.zeros_like(ids, dtype=getattr(torch, dtype or "int32"))
        if name == "cache_position":
            return positions
        if name == "input_pos":  # a program holding its cache (ExecuTorch's LLM runner's): where the tokens go
            if self.runner.max_cache_len and self.past + q > self.runner.max_cache_len:
                raise ExportError(f"{self.past + q} tokens do not fit the program's cache of {self.runner.max_cache_len}",
                                  remedy="export with a larger max_cache_len (--static-cache N)")
            return positions[:1]
        if name == "attention_mask" and self.is_seq2seq:
            return self.prompt_mask
        if name.endswith("attention_mask"):
            if len(shape) == 4:  # the documented boolean causal mask over a static cache's slots
                length = self._cache_length()
                if self.past + q > length:
                    raise ExportError(f"{self.past + q} tokens do not fit the static cache of {length}",
                                      remedy="export with a larger max_cache_len (--static-cache N)")
                attended = self.past + q if self.runner.attends_written_slots(record, shape) else length
                mask = (torch.arange(attended) <= positions[:, None])[None, None]
                return mask if dtype in ("bool", "") else mask.to(getattr(torch, dtype))
            return torch.ones((1, self.past + q), dtype=getattr(torch, dtype or "int64"))
        if name.startswith("encoder_outputs") or name == "encoder_hidden_states":
            return self.encoder_hidden
        if name in self.encoder_inputs:
            return torch.as_tensor(self.encoder_inputs[name])
        raise ExportError(f"the runner does not know how to fill the input {name!r}",
                          remedy="drive this component yourself; its inputs are listed in manifest.json")

    def _cache_length(self) -> int | None:
        """A static cache's length: its key buffers' (read before a session holds them), else the
        manifest's `max_cache_len`; `None` for a cache without either (Mamba's states)."""
        if self.length is None:
            keys = [v for k, v in self.cache.items() if k.endswith(".keys") and v.dim() == 4]
            if keys:
                self.length = int(keys[0].shape[2])
            elif self.runner.max_cache_len:
                self.length = int(self.runner.max_cache_len)
        return self.length


def _zeros(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero cache buffer.

    # NOTE: zeroed pages from the allocator (numpy's calloc) where numpy has the dtype, not
    # `torch.zeros`' parallel fill: on the loaded 2-CPU machine its OpenMP fill of the 134 MB
    # Llama's 16 cache buffers at 256 slots took 0.4 s of a 32-token prompt's 0.7 s to first token
    # (`bench/onnx_genai.py`).
    """
    try:
        kind = torch.empty((), dtype=dtype).numpy().dtype
    except TypeError:  # bfloat16
        return torch.zeros(shape, dtype=dtype)
    return torch.from_numpy(np.zeros(shape, dtype=kind))


def _attends_written_slots(record, mask_shape) -> bool:
    """Whether a program's attention reads as many slots as its 4-D mask covers: the mask's last
    axis is a size of its own, not the cache's length (`generation/attended.py`)."""
    lengths = {shape[2] for name, shape in zip(record.input_names, record.input_shapes)
               if name.endswith(".keys") and len(shape) == 4}
    return isinstance(mask_shape[-1], str) and bool(lengths) and mask_shape[-1] not in lengths


def _as_prompt(input_ids: Any) -> torch.Tensor:
    """A prompt (a list of ints or a tensor) as a `[1, n]` int64 tensor."""
    if isinstance(input_ids, torch.Tensor):
        return input_ids.reshape(1, -1).long()
    return torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)


def _logits_processors(config: Any, eos: list[int]):
    """transformers' processors for the options `config` sets, in `generate()`'s order (the suppress
    lists by `suppress.py`'s, which give the same scores without a `torch.isin` a step)."""
    from .suppress import SuppressTokens, SuppressTokensAtBegin
    from transformers.generation.logits_process import (
        ForcedBOSTokenLogitsProcessor,
        ForcedEOSTokenLogitsProcessor,
        LogitsProcessorList,
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList()
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty=config.repetition_penalty))
    if config.min_new_tokens and eos:
        processors.append(_AtFirstCall(
            lambda start: MinNewTokensLengthLogitsProcessor(start, config.min_new_tokens, eos)))
    if getattr(config, "forced_bos_token_id", None) is not None:  # BART/mBART: the first token is forced
        processors.append(ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
    if getattr(config, "forced_eos_token_id", None) is not None:  # ... and the last one, at max_new_tokens
        processors.append(_AtFirstCall(
            lambda start: ForcedEOSTokenLogitsProcessor(start + config.max_new_tokens, config.forced_eos_token_id)))
    if getattr(config, "suppress_tokens", None) is not None:  # never chosen (Whisper: symbols it does not write)
        processors.append(SuppressTokens(config.suppress_tokens))  # transformers' own: suppress.py says why not
    if getattr(config, "begin_suppress_tokens", None) is not None:  # not chosen first
        forced_first = config.forced_bos_token_id is not None
        processors.append(_AtFirstCall(lambda start: SuppressTokensAtBegin(
            config.begin_suppress_tokens, start + 1 if start == 1 and forced_first else start)))
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k is not None and config.top_k != 0:
            processors.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
        if config.top_p is not None and config.top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    return processors


class _AtFirstCall:
    """A processor that needs the length the sequence had before the first new token (the prompt
    for a decoder-only model, the decoder start for an encoder-decoder): built at the first call."""

    def __init__(self, make: Callable[[int], Any]):
        self.make, self.inner = make, None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.inner is None:
            self.inner = self.make(input_ids.shape[1])
        return self.inner(input_ids, scores)
