"""What running an example concludes: each stage's `Failure`, the example's `Outcome`, and the
`signature` that tells one failure from another."""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass
class Failure:
    """What went wrong at one stage: an exception (`error`) or numbers that differ (`mismatch`)."""

    stage: str
    kind: str  # "error" | "mismatch"
    message: str
    signature: str  # an error's first line, numbers and symbols blanked; what differs, and on which architecture
    error_type: str = ""

    @property
    def category(self) -> str:
        """`<stage> <kind>`: how the summary counts failures."""
        return f"{self.stage} {self.kind}"

    def key(self) -> tuple[str, str, str]:
        """What tells distinct failures apart (each is shrunk on its own)."""
        return self.stage, self.kind, self.signature


def signature(text: str) -> str:
    """`text`'s first line with what varies between examples blanked: model class names, symbols
    (`s42`), numbers; so one cause met at other sizes or on other models is one failure."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    line = re.sub(r"\b[A-Z]\w*(?:ForCausalLM|ForConditionalGeneration|LMHeadModel|Model)\b", "<model>", line)
    line = re.sub(r"\bs\d+\b", "s?", line)
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", line)[:200]


@dataclasses.dataclass
class Outcome:
    """Every failure and refusal of one example, and how long it took."""

    failures: list[Failure] = dataclasses.field(default_factory=list)
    refusals: list[Failure] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    invalid: str | None = None  # eager PyTorch itself rejects the example: not a case

    @property
    def status(self) -> str:
        """`invalid`, `failed`, `refused` or `passed`, in that precedence."""
        if self.invalid:
            return "invalid"
        return "failed" if self.failures else ("refused" if self.refusals else "passed")


class InvalidExample(Exception):
    """Eager PyTorch cannot run the example (the drawn config is not a model): no verdict."""


def first_lines(error: BaseException, count: int = 3) -> str:
    """The first `count` non-empty lines of `Type: message` of `error`, and its root cause where they
    do not name it (`errors.summarize`)."""
    from ..errors import summarize

    lines = [line for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    root = summarize(error)
    text = "\n".join(lines[:count])
    return text if root.split(":")[0] in text else f"{text}\n(cause) {root}"
