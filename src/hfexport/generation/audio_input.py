"""Generation from an audio file: the feature extractor saved with a speech export (Whisper's) turns
a clip into the `input_features` its encoder takes; an audio-text LLM's processor (Qwen2-Audio's)
turns a clip and a text prompt into the prompt's ids, one audio token per row of the clip, and the
features with their per-frame mask.

```python
runner = GenerationRunner.load("out/whisper-gen")   # hfexport export MODEL --generate, with its processor
runner.generate_from_audio("clip.wav", max_new_tokens=32).text
GenerationRunner.load("out/qwen2-audio-gen").generate_from_audio("clip.wav", prompt="What do you hear?")
```

# NOTE: the features are the saved feature extractor's own, so the tokens equal eager
# `model.generate(input_features=...)`'s on them. What comes before it is ours: the file is read with
# soundfile (wav, flac: what libsndfile reads), its channels mixed to mono by their mean (what
# ffmpeg's `-ac 1` does, with which transformers' pipeline reads files), and resampled to the
# extractor's `sampling_rate` with scipy's polyphase filter (`resample_poly`). A clip longer than the
# extractor's chunk (`n_samples`: 30 s for Whisper) is refused rather than cut: the extractor would
# drop the rest without a word, and transformers' long-form generation (30 s windows moved on by the
# timestamps the model writes) is not hfexport's yet. An audio-text LLM's prompt is its processor's
# work, as an image-text model's is (`image_input.py`): the chat template places the clip, the
# processor repeats the audio token once per row the clip gives.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .._versions import pip_line
from ..errors import PrepareError

__all__ = ["AUDIO_INPUT_NAMES", "DEFAULT_AUDIO_PROMPT", "read_audio", "audio_clip", "audio_features",
           "audio_prompt_text", "audio_prompt_inputs", "sample_clip"]

#: The feature extractor's outputs a speech encoder takes (`GenerationRunner.is_speech`).
AUDIO_INPUT_NAMES = ("input_features",)
#: What an audio-text LLM is asked about a clip when the caller gives no prompt.
DEFAULT_AUDIO_PROMPT = "Transcribe the audio."
#: The remedy of a clip this install or this export cannot read.
_ARRAYS_INSTEAD = "or pass the feature extractor's arrays: --audio-inputs FILE.npz (input_features=...)"


def read_audio(path: str | os.PathLike, sampling_rate: int) -> np.ndarray:
    """The samples of the audio file `path` as float32 mono at `sampling_rate` Hz.

    Raises:
        ImportError: soundfile or scipy is not installed (`pip install "hfexport[audio]"`).
        PrepareError: no such file, or one soundfile cannot read as audio, or one without samples.
    """
    try:
        import soundfile
    except ImportError as error:
        raise ImportError(f"reading an audio file needs soundfile, which is not installed. Install it with: "
                          f"{pip_line('audio')}   ({_ARRAYS_INSTEAD})") from error
    if not os.path.isfile(path):
        raise PrepareError(f"no audio file {os.fspath(path)!r}", remedy="pass the path of a WAV or FLAC file")
    try:
        samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    except soundfile.SoundFileError as error:
        raise PrepareError(f"cannot read {os.fspath(path)!r} as audio: {error}",
                           remedy="pass a WAV or FLAC file (any format libsndfile reads)") from error
    if samples.shape[0] == 0:
        raise PrepareError(f"{os.fspath(path)!r} holds no samples", remedy="pass a clip that is not empty")
    return _as_mono(samples, rate, sampling_rate)


def audio_clip(processor: Any, audio: Any, sampling_rate: int | None = None) -> np.ndarray:
    """The samples the feature extractor of `processor` (a speech processor, or a feature extractor)
    is given for `audio`: a file (`read_audio`), or samples at `sampling_rate` Hz (default: the
    extractor's), `[samples]` or `[samples, channels]`; float32 mono at the extractor's rate.

    Raises:
        PrepareError: the clip is longer than the extractor's chunk (`n_samples`), or unreadable.
    """
    extractor = getattr(processor, "feature_extractor", processor)
    rate = int(extractor.sampling_rate)
    if isinstance(audio, (str, os.PathLike)):
        where, clip = os.fspath(audio), read_audio(audio, rate)
    else:
        samples = np.asarray(audio, dtype=np.float32)
        if samples.ndim not in (1, 2) or samples.size == 0:
            raise PrepareError(f"audio takes samples as [samples] or [samples, channels], got shape {list(samples.shape)}",
                               remedy="pass a 1-D array of samples, or a file")
        where, clip = "the clip", _as_mono(samples.reshape(samples.shape[0], -1), sampling_rate or rate, rate)
    limit = getattr(extractor, "n_samples", None)
    if limit is not None and clip.shape[0] > limit:
        raise PrepareError(
            f"{where} is {clip.shape[0] / rate:.2f} s long; the model's feature extractor takes at most {limit / rate:.2f} s "
            f"({limit} samples at {rate} Hz), and hfexport does not yet cut long audio into chunks as transformers' "
            "long-form generation does", remedy=f"cut it into clips of at most {limit / rate:.2f} s and generate from each")
    return clip


def audio_features(processor: Any, audio: Any, sampling_rate: int | None = None) -> dict[str, Any]:
    """The encoder inputs (`AUDIO_INPUT_NAMES`) the feature extractor of `processor` makes of `audio`
    (`audio_clip`: a file or samples).

    Raises:
        PrepareError: the clip is longer than the extractor's chunk (`n_samples`), or unreadable.
    """
    extractor = getattr(processor, "feature_extractor", processor)
    clip = audio_clip(processor, audio, sampling_rate)
    features = extractor(clip, sampling_rate=int(extractor.sampling_rate), return_tensors="pt")
    return {name: features[name] for name in AUDIO_INPUT_NAMES if name in features}


def sample_clip(extractor: Any, seed: int = 0, share: float = 0.6) -> np.ndarray:
    """A clip made offline for a speech export's checks: float32 mono samples at `extractor`'s
    sampling rate, `share` of its chunk long (`n_samples`; 1 s where it has none), a tone of 440 Hz
    and one of 660 Hz with noise (seeded)."""
    rate = int(extractor.sampling_rate)
    length = int(share * (getattr(extractor, "n_samples", None) or rate))
    t = np.arange(length) / rate
    noise = np.random.default_rng(seed).standard_normal(length)
    return (0.4 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 660 * t) + 0.05 * noise).astype(np.float32)


def held_out_clip(extractor: Any, seed: int = 1) -> np.ndarray:
    """Another clip made offline, unlike `sample_clip` (which an export is calibrated and checked
    on): a chirp sweeping 200 Hz to 3 kHz under a tone of 330 Hz with noise (seeded), 0.85 of the
    extractor's chunk long; what a quantized speech export's accuracy gate also transcribes."""
    rate = int(extractor.sampling_rate)
    length = int(0.85 * (getattr(extractor, "n_samples", None) or rate))
    t = np.arange(length) / rate
    sweep = 2 * np.pi * (200 * t + (3000 - 200) * t**2 / (2 * t[-1]))
    noise = np.random.default_rng(seed).standard_normal(length)
    return (0.35 * np.sin(sweep) + 0.15 * np.sin(2 * np.pi * 330 * t) + 0.08 * noise).astype(np.float32)


def audio_prompt_text(processor: Any, prompt: str | None) -> str:
    """The text an audio-text LLM's processor is given with one clip: `prompt` (default
    `DEFAULT_AUDIO_PROMPT`) as it is where it already holds the processor's audio token; else one user
    turn (the clip, then `prompt`) formatted with the processor's chat template and its generation
    prompt; else, without a template, the audio token then `prompt`."""
    token = getattr(processor, "audio_token", None)
    if token is None:
        raise PrepareError(f"the saved processor ({type(processor).__name__}) names no audio token",
                           remedy="pass the processor's arrays and the prompt's ids: --audio-inputs FILE.npz "
                           "(input_ids, input_features, its mask)")
    prompt = DEFAULT_AUDIO_PROMPT if prompt is None else prompt
    if token in prompt:
        return prompt
    if getattr(processor, "chat_template", None):
        messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": prompt}]}]
        return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return token + prompt


def audio_prompt_inputs(processor: Any, audio: Any, prompt: str | None,
                        sampling_rate: int | None = None) -> dict[str, Any]:
    """The processor's tensors for one clip (`audio_clip`) and `prompt` (`audio_prompt_text`): the
    prompt's `input_ids`, with one audio token per row of the clip, and the features and their
    per-frame mask (Qwen2-Audio's `input_features`, `feature_attention_mask`)."""
    clip = audio_clip(processor, audio, sampling_rate)
    rate = int(processor.feature_extractor.sampling_rate)
    inputs = processor(text=[audio_prompt_text(processor, prompt)], audio=[clip], sampling_rate=rate,
                       return_tensors="pt")
    return {name: value for name, value in inputs.items() if name != "attention_mask"}


def _as_mono(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """`[samples, channels]` at `rate` Hz as one channel (their mean) at `target` Hz (scipy's
    `resample_poly`, by the reduced ratio of the two rates)."""
    mono = samples.mean(axis=1, dtype=np.float32) if samples.shape[1] > 1 else samples[:, 0]
    if int(rate) == int(target):
        return np.ascontiguousarray(mono, dtype=np.float32)
    try:
        from scipy.signal import resample_poly
    except ImportError as error:
        raise ImportError(f"resampling audio from {rate} Hz to the model's {target} Hz needs scipy, which is not "
                          f"installed. Install it with: {pip_line('audio')}   ({_ARRAYS_INSTEAD})") from error
    common = math.gcd(int(rate), int(target))
    return resample_poly(mono, int(target) // common, int(rate) // common).astype(np.float32)
