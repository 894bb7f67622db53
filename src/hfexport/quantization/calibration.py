"""Calibration prompts: read from a file (`--calibration-data`), or the built-in default set.

A static scheme (`int8-static`) and NNCF's data-aware options (`awq`, `scale_estimation`) run the
model on these prompts, each tokenized with the model's tokenizer into the same inputs as the
export sample (`job.calibration.calibration_for`). Only the token ids are held for all prompts; every
quantizer runs the model on one sample at a time (PT2E's loop, ONNX Runtime's data reader,
`nncf.Dataset`), so the activations' memory stays flat in the number of prompts.

# NOTE: why a default of many prompts rather than the one sample prompt: one prompt's activation
# ranges are the ranges of a dozen tokens; ONNX `int8-static` of SmolLM2 calibrated on
# "Hello, world!" agreed with fp32 on ~16% of greedy steps (tests/test_real_llm.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["DEFAULT_PROMPTS", "read_prompts", "chosen_prompts"]

#: Diverse prompts calibration runs on without `--calibration-data`: chat, code, prose, lists,
#: numbers and other languages, so that activation ranges see more than one kind of text.
DEFAULT_PROMPTS = (
    "Hello, world!",
    "What is the capital of France? Answer in one sentence.",
    "Can you help me write a polite email asking my manager for a day off next Friday?",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)",
    "import numpy as np\nx = np.linspace(0, 1, 100)\nprint(x.mean(), x.std())",
    "SELECT name, COUNT(*) FROM orders WHERE created_at > '2024-01-01' GROUP BY name;",
    "The river wound slowly through the valley, its banks lined with willows that bent toward the water.",
    "In 1969, Apollo 11 landed on the Moon, and Neil Armstrong became the first person to walk on its surface.",
    "Shopping list:\n1. eggs\n2. milk\n3. bread\n4. three apples\n5. coffee beans",
    "- Install the package\n- Run the tests\n- Open a pull request\n- Wait for review",
    "Explain step by step why the sum of the angles of a triangle is 180 degrees.",
    "Le chat dort sur le canapé pendant que la pluie tombe doucement sur la ville.",
    "Der schnelle braune Fuchs springt über den faulen Hund, und alle lachen darüber.",
    "El conocimiento es poder, pero la imaginación es más importante que el conocimiento.",
    "今日はとても良い天気なので、公園で散歩しましょう。",
    "机器学习是人工智能的一个分支，它让计算机从数据中学习。",
    "Translate to Spanish: The meeting has been moved to 3 pm on Thursday.",
    "Q: If a train travels 120 km in 1.5 hours, what is its average speed?\nA:",
    '{"name": "Ada", "age": 36, "languages": ["English", "French"], "active": true}',
    "Once upon a time, in a small village at the edge of a forest, there lived an old clockmaker.",
)


def read_prompts(path: str | os.PathLike, num_samples: int | None = None) -> list[str]:
    """The prompts of a calibration file: a `.txt` holds one prompt a line; a `.jsonl` one JSON
    object a line with a `"text"` or `"prompt"` field. Blank lines are skipped; at most
    `num_samples` are kept (the first ones). Raises `ValueError` naming the file and line."""
    path = Path(path)
    if path.suffix not in (".txt", ".jsonl"):
        raise ValueError(f"--calibration-data {path}: expected a .txt (one prompt a line) or a .jsonl "
                         '(one {"text": ...} or {"prompt": ...} object a line)')
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--calibration-data {path}: cannot be read ({error}); give a UTF-8 text file") from error
    read = _jsonl_prompt if path.suffix == ".jsonl" else (lambda line, _path, _number: line)
    prompts = [read(line, path, number) for number, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise ValueError(f"--calibration-data {path} holds no prompt; give one prompt a line")
    return prompts[:num_samples] if num_samples is not None else prompts


def _jsonl_prompt(line: str, path: Path, number: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"--calibration-data {path}, line {number}: not JSON ({error.msg})") from None
    text = next((record[k] for k in ("text", "prompt") if isinstance(record, dict) and k in record), None)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f'--calibration-data {path}, line {number}: no "text" or "prompt" string field')
    return text


def chosen_prompts(calibration_data: str | os.PathLike | None, num_samples: int) -> list[str]:
    """The prompts calibration runs on: the file's (`read_prompts`), else `DEFAULT_PROMPTS`; at most `num_samples`."""
    if calibration_data is not None:
        return read_prompts(calibration_data, num_samples)
    return list(DEFAULT_PROMPTS[:num_samples])
