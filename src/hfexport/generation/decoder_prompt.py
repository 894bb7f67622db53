"""The decoder prompt of an encoder-decoder's generation: the decoder start token, and for a speech
model (Whisper) the prompt tokens its generation config names.

```python
decoder_prompt(generation_config, config)   # T5: [0]; an English-only Whisper: [<|startoftranscript|>, <|notimestamps|>]
```

# NOTE: the rules are those of transformers 5.24's `WhisperGenerationMixin._retrieve_init_tokens`
# (short-form, one sequence), read from the generation config's own fields, not from a model class:
# the decoder start token; `forced_decoder_ids` taken in order from position 1 where neither
# `language` nor `task` is set; the language token of `language`, or `DETECT_LANGUAGE` where the
# config has `lang_to_id` and names no language (the runner picks it from the decoder's first
# logits, as `detect_language` does); the task token; `<|notimestamps|>` where the config has
# `no_timestamps_token_id` and does not ask for timestamps. A model without those fields (T5, BART)
# gets its decoder start token alone, as `generate` gives it. Timestamps (`return_timestamps`) need
# Whisper's timestamp logits processor, which hfexport's loop does not have: refused.
# `tests/generation/test_decoder_prompt.py` holds these rules to transformers' own on the same configs.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import PrepareError
from .result import as_token_list

__all__ = ["DETECT_LANGUAGE", "decoder_prompt", "detected_language", "check_decoder_length"]

#: The place of the language token in a prompt whose language the decoder's first logits pick.
DETECT_LANGUAGE = -1


def decoder_prompt(generation_config: Any, config: Any) -> list[int]:
    """The tokens the decoder starts from (see the module docstring), `DETECT_LANGUAGE` where the
    language token is to be detected.

    Raises:
        PrepareError: the configs name no decoder start token, `forced_decoder_ids` leave a gap,
            a language or task the config has no token for, or timestamps are asked for.
    """
    start = getattr(generation_config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        raise PrepareError("the saved configs name no decoder_start_token_id",
                           remedy="set it in the model's generation_config.json and export again")
    prompt: list[int | None] = [int(as_token_list(start)[0])]
    language = getattr(generation_config, "language", None)
    task = getattr(generation_config, "task", None)
    if language is None and task is None:
        prompt += _forced_tokens(generation_config, config)
    lang_to_id = getattr(generation_config, "lang_to_id", None)
    if language is not None:
        _put_language(prompt, _language_id(language, lang_to_id or {}))
    elif lang_to_id and (len(prompt) == 1 or prompt[1] is None):
        _put_language(prompt, DETECT_LANGUAGE)
    task_to_id = getattr(generation_config, "task_to_id", None) or {}
    if task is not None:
        if task not in task_to_id:
            raise PrepareError(f"the generation config's task {task!r} is none of its task_to_id ({sorted(task_to_id)})",
                               remedy="set task to one of them in generation_config.json and export again")
        prompt = [token for token in prompt if token not in task_to_id.values()] + [task_to_id[task]]
    elif language is not None and task_to_id and not any(token in task_to_id.values() for token in prompt):
        prompt.append(task_to_id["transcribe"])
    if getattr(generation_config, "return_timestamps", None):
        raise PrepareError("the generation config asks for timestamps (return_timestamps), which need Whisper's "
                           "timestamp logits processor: hfexport's loop generates text tokens only",
                           remedy="set return_timestamps to false in the model's generation_config.json and export "
                           "again, or drive the components yourself")
    no_timestamps = getattr(generation_config, "no_timestamps_token_id", None)
    if no_timestamps is not None and prompt[-1] != no_timestamps:
        prompt.append(int(no_timestamps))
    return [int(token) for token in prompt if token is not None]


def detected_language(logits: torch.Tensor, generation_config: Any) -> int:
    """The language token of the highest logit among `lang_to_id`'s (`logits`: the decoder's last
    position after the decoder start token), as `WhisperGenerationMixin.detect_language` picks it."""
    languages = torch.tensor(sorted(generation_config.lang_to_id.values()))
    return int(languages[logits[..., languages].reshape(-1).float().argmax()])


def check_decoder_length(prompt_length: int, max_new_tokens: int, config: Any) -> None:
    """Refuse a generation that would run past the decoder's positions (`max_target_positions`,
    Whisper's 448), as `generate` refuses it.

    Raises:
        PrepareError: the prompt and `max_new_tokens` are more than the decoder has positions for.
    """
    limit = getattr(config, "max_target_positions", None)
    if limit is not None and prompt_length + max_new_tokens > limit:
        raise PrepareError(f"the decoder prompt's {prompt_length} tokens and {max_new_tokens} new ones are more than "
                           f"the decoder's {limit} positions (max_target_positions)",
                           remedy=f"ask for at most {limit - prompt_length} new tokens (--max-new-tokens)")


def _forced_tokens(generation_config: Any, config: Any) -> list[int | None]:
    """`forced_decoder_ids` (the generation config's, else the model config's) as tokens after the
    decoder start: `[[1, a], [2, b], ...]` gives `[a, b, ...]`; a list that does not start at 1 is
    not used, as `generate` does not use it."""
    forced = getattr(generation_config, "forced_decoder_ids", None) or getattr(config, "forced_decoder_ids", None)
    if not forced or forced[0][0] != 1:
        return []
    tokens = []
    for expected, (position, token) in enumerate(forced, start=1):
        if position != expected:
            raise PrepareError(f"forced_decoder_ids {forced} leave position {expected} out",
                               remedy="give a token for every position from 1 on in generation_config.json")
        tokens.append(token)
    return tokens


def _put_language(prompt: list[int | None], token: int) -> None:
    """Put the language `token` after the decoder start: in the place of a forced language, or appended."""
    if len(prompt) > 1:
        prompt[1] = token
    else:
        prompt.append(token)


def _language_id(language: str, lang_to_id: dict[str, int]) -> int:
    """The token of `language` ("en", "english" or "<|en|>"), as `generate` looks it up."""
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

    language = language.lower()
    token = language if language in lang_to_id else (
        f"<|{TO_LANGUAGE_CODE[language]}|>" if language in TO_LANGUAGE_CODE else f"<|{language}|>")
    if token not in lang_to_id:
        raise PrepareError(f"the generation config's language {language!r} has no token in its lang_to_id",
                           remedy="set language to one of lang_to_id's in generation_config.json and export again")
    return int(lang_to_id[token])
