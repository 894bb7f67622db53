"""What `validate` returns: per output, per case, and for the whole artifact, with the rule applied
and a readable table (`ValidationReport.to_table`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["OutputDiff", "CaseReport", "ValidationReport"]


@dataclasses.dataclass
class OutputDiff:
    """One output of one case: its shape and its distance from eager."""

    name: str
    shape: list[int]
    max_abs: float
    max_rel: float
    passed: bool
    error: str | None = None
    cosine: float | None = None  # cosine similarity with eager (float outputs)
    below_floor: bool = False  # under an advisory cosine floor (`validate(cosine_advisory=...)`): reported, not failed


@dataclasses.dataclass
class CaseReport:
    """One set of inputs run through the artifact and eager."""

    label: str
    input_shapes: dict[str, list[int]]
    outputs: list[OutputDiff]
    error: str | None = None
    padded_positions: int = 0  # attention_mask == 0 positions left out of the comparison

    @property
    def passed(self) -> bool:
        """Whether the case ran and every output passed."""
        return self.error is None and all(o.passed for o in self.outputs)


@dataclasses.dataclass
class ValidationReport:
    """The result of `validate`: every case, the tolerance used, and where it ran."""

    format: str
    model_class: str
    runtime: str
    precision: str
    atol: float
    rtol: float
    cases: list[CaseReport]
    note: str = ""
    min_cosine: float | None = None  # set: float outputs were judged by cosine similarity
    min_cache_cosine: float | None = None  # the cache tensors' floor under `min_cosine` (None: the same)
    cosine_advisory: str | None = None  # set: the cosine floors were advisory, and why (`validate`)

    @property
    def passed(self) -> bool:
        """Whether every case passed (and there was at least one)."""
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def max_abs(self) -> float:
        """The largest absolute difference over every output of every case."""
        values = [o.max_abs for c in self.cases for o in c.outputs if not math.isnan(o.max_abs)]
        return max(values, default=float("nan"))

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict, with each case's verdict and the rule applied."""
        out = dataclasses.asdict(self)
        out["passed"] = self.passed
        out["rule"] = self.rule
        for case, raw in zip(self.cases, out["cases"]):
            raw["passed"] = case.passed
        return out

    @property
    def rule(self) -> str:
        """What an output had to meet to pass, in words."""
        if self.min_cosine is None:
            return (f"tolerance: atol={self.atol:g}, rtol={self.rtol:g}  (pass if max|artifact - eager| <= "
                    "atol + rtol * max|eager|; exact for int/bool)")
        cache = self.min_cosine if self.min_cache_cosine is None else self.min_cache_cosine
        if self.cosine_advisory:
            return (f"quantized: cosine similarity with eager measured against advisory floors {self.min_cosine:g}, "
                    f"{cache:g} for cache tensors ({self.cosine_advisory}); shapes, int/bool values and "
                    "non-finite values must match")
        return (f"pass if the cosine similarity with eager is >= {self.min_cosine:g}, >= {cache:g} for cache "
                "tensors (quantized; exact for int/bool)")

    @property
    def below_floor(self) -> list[str]:
        """`case/output` of every output under its advisory cosine floor."""
        return [f"{c.label}/{o.name}" for c in self.cases for o in c.outputs if o.below_floor]

    def to_table(self) -> str:
        """A readable table: one row per case and output."""
        lines = [f"validation of {self.model_class} ({self.format}) in {self.runtime}, precision {self.precision}",
                 self.rule]
        width = max([len(o.name) for c in self.cases for o in c.outputs] + [6])
        cos = self.min_cosine is not None
        lines.append(f"  {'case':<10} {'output':<{width}} {'shape':<18} {'max abs':>10} {'max rel':>10}"
                     + (f" {'cosine':>9}" if cos else "") + "  result")
        for case in self.cases:
            if case.padded_positions:
                lines.append(f"  {case.label:<10} ({case.padded_positions} padded positions not compared)")
            if case.error:
                lines.append(f"  {case.label:<10} {'-':<{width}} {'-':<18} {'-':>10} {'-':>10}  FAIL: {case.error}")
            for o in case.outputs:
                verdict = ("below floor (advisory)" if o.below_floor else "ok") if o.passed else \
                    f"FAIL{': ' + o.error if o.error else ''}"
                lines.append(
                    f"  {case.label:<10} {o.name:<{width}} {str(o.shape):<18} {o.max_abs:>10.3g} {o.max_rel:>10.3g}"
                    + (f" {o.cosine if o.cosine is not None else float('nan'):>9.6f}" if cos else "") + f"  {verdict}"
                )
        lines.append(f"result: {'PASSED' if self.passed else 'FAILED'}" + (f" ({self.note})" if self.note else ""))
        return "\n".join(lines)
