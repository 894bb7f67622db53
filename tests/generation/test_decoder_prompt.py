"""The decoder prompt of an encoder-decoder's generation (`generation/decoder_prompt.py`) is the one
transformers' Whisper `generate` builds, on the generation configs Whisper checkpoints carry, and a
model without prompt fields gets its decoder start token alone."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hfexport.errors import PrepareError
from hfexport.generation.decoder_prompt import (DETECT_LANGUAGE, check_decoder_length, decoder_prompt,
                                                detected_language)
from hfexport.presets import build_preset

LANGUAGES = {"<|en|>": 120, "<|fr|>": 121, "<|de|>": 122}
TASKS = {"translate": 123, "transcribe": 124}
MULTILINGUAL = dict(lang_to_id=LANGUAGES, task_to_id=TASKS, is_multilingual=True, no_timestamps_token_id=127)
#: generation configs as checkpoints carry them (the tiny preset's ids)
CONFIGS = {
    "english-only": dict(no_timestamps_token_id=127, is_multilingual=False, return_timestamps=False),
    "english-only, forced ids": dict(forced_decoder_ids=[[1, 127]]),  # whisper-tiny.en's older file
    "language and task": dict(MULTILINGUAL, language="fr", task="translate"),
    "language by name": dict(MULTILINGUAL, language="german"),
    "forced language and task": dict(MULTILINGUAL, forced_decoder_ids=[[1, 121], [2, 124]]),
    "language detected": dict(MULTILINGUAL, forced_decoder_ids=[[1, None], [2, 124]]),
    "language detected, no forced ids": dict(MULTILINGUAL),
    "no prompt tokens": dict(),  # T5, BART: the decoder start alone
}
DETECTED = 122


@pytest.fixture(scope="module")
def whisper():
    return build_preset("whisper")[0]


@pytest.mark.parametrize("name", CONFIGS)
def test_the_prompt_is_the_one_whispers_generate_builds(whisper, name, monkeypatch):
    """Against transformers 5.24's own `WhisperGenerationMixin._retrieve_init_tokens` (a private
    method: this test fails the day it moves), its language detection answering `DETECTED`."""
    config = GenerationConfig(decoder_start_token_id=1, **CONFIGS[name])
    reference = GenerationConfig(decoder_start_token_id=1, **CONFIGS[name])
    reference.return_timestamps = getattr(reference, "return_timestamps", None)  # as `generate` sets it first
    monkeypatch.setattr(whisper, "detect_language", lambda **kwargs: torch.tensor([DETECTED]))
    features = torch.zeros(1, 8, 32)
    expected = whisper._retrieve_init_tokens(features, batch_size=1, generation_config=reference,
                                             config=whisper.config, num_segment_frames=32, kwargs={})[0].tolist()
    prompt = decoder_prompt(config, whisper.config)
    if "detected" in name:
        assert prompt[1] == DETECT_LANGUAGE
        prompt[1] = DETECTED
    assert prompt == expected


def test_a_detected_language_is_the_likeliest_language_token():
    config = GenerationConfig(lang_to_id=LANGUAGES)
    logits = torch.zeros(128)
    logits[[5, 121, 122]] = torch.tensor([9.0, 2.0, 1.0])  # a text token above every language
    assert detected_language(logits, config) == 121


def test_timestamps_are_refused_naming_the_setting(whisper):
    config = GenerationConfig(decoder_start_token_id=1, no_timestamps_token_id=127, return_timestamps=True)
    with pytest.raises(PrepareError, match="return_timestamps"):
        decoder_prompt(config, whisper.config)


def test_forced_ids_with_a_gap_are_refused(whisper):
    with pytest.raises(PrepareError, match="leave position 2 out"):
        decoder_prompt(GenerationConfig(decoder_start_token_id=1, forced_decoder_ids=[[1, 127], [3, 5]]), whisper.config)


def test_the_decoders_positions_bound_the_new_tokens(whisper):
    check_decoder_length(2, 30, whisper.config)  # the tiny decoder's 32 positions
    with pytest.raises(PrepareError, match="ask for at most 30 new tokens"):
        check_decoder_length(2, 31, whisper.config)
    check_decoder_length(2, 10_000, build_preset("t5")[0].config)  # relative positions: no bound
