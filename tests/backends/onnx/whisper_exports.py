"""What the onnxruntime-genai Whisper tests share (tests/backends/onnx/test_whisper.py, and the
deploy page's snippet in tests/test_deploy_docs.py): a tiny random Whisper whose encoder takes the
3000 frames onnxruntime-genai 0.18 feeds every Whisper (`max_source_positions` 1500, 80 mel bins,
Whisper's own 30 s feature extractor), saved as a model folder with its processor; its flagless CLI
export to ONNX, made once per test run; clips drawn here; and eager `generate()`'s tokens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: what `og_whisper` changes in `tiny:whisper`: og's 3000 frames (1500 positions) and Whisper's 80 mels
OG_SIZES = dict(max_source_positions=1500, num_mel_bins=80)
#: the samples of silence a clip starts with where og's features must be transformers' (n_fft / 2:
#: og's STFT pads the first frame with zeros, transformers' reflects the clip)
ONSET = 200
#: og's clip length: its processor pads the spectrum, transformers the samples, to 30 s
CHUNK = 30 * 16000


def og_whisper(seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, Any]:
    """`tiny:whisper` with og's frame count (`OG_SIZES`, then `overrides`) and its processor:
    Whisper's default feature extractor of the model's mel bins, the preset's tokenizer."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor

    from hfexport.presets import build_preset, tiny_processor

    model, _ = build_preset("whisper", seed, **{**OG_SIZES, **overrides})
    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    return model, WhisperProcessor(feature_extractor=extractor, tokenizer=tiny_processor("whisper").tokenizer)


def saved(model: torch.nn.Module, processor: Any, folder: Path) -> Path:
    """`model` and `processor` saved as a model folder, as `save_pretrained` writes one."""
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def og_whisper_export(shared_folder: Any) -> Path:
    """`hfexport export FOLDER -f onnx -o OUT` of `og_whisper()` saved, in a new process, no task flag,
    made once per test run."""

    def write(folder: Path) -> None:
        saved(*og_whisper(), folder / "model")
        done = subprocess.run([sys.executable, "-m", "hfexport", "export", str(folder / "model"), "-f", "onnx", "-o",
                               str(folder / "export")], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]

    return shared_folder("og-whisper-onnx", write) / "export"


def tone(path: Path, seconds: float, hz: int, *, onset: int = 0, padded: bool = False, seed: int = 0) -> Path:
    """A float32 WAV at 16 kHz: a tone of `hz` with noise, `seconds` long after `onset` samples of
    silence, zeros after it up to 30 s where `padded`."""
    import soundfile

    rate = 16000
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.shape)
    samples = np.concatenate([np.zeros(onset), 0.5 * np.sin(2 * np.pi * hz * t) + 0.05 * noise])
    if padded:
        samples = np.pad(samples, (0, CHUNK - len(samples)))
    soundfile.write(path, samples.astype(np.float32), rate, subtype="FLOAT")
    return path


def features(processor: Any, clip: Path) -> np.ndarray:
    """The feature extractor's `input_features` of the clip's samples."""
    import soundfile

    samples, rate = soundfile.read(clip, dtype="float32")
    return processor.feature_extractor(samples, sampling_rate=rate, return_tensors="np")["input_features"]


def eager(model: torch.nn.Module, input_features: np.ndarray, new_tokens: int,
          generation_config: Any = None) -> list[int]:
    """Eager `generate()`'s greedy new tokens (after the decoder prompt) on `input_features`."""
    with torch.no_grad():
        out = model.generate(input_features=torch.as_tensor(input_features), max_new_tokens=new_tokens,
                             do_sample=False, generation_config=generation_config, return_dict_in_generate=True,
                             output_logits=True)
    return out.sequences[0, out.sequences.shape[1] - len(out.logits):].tolist()
