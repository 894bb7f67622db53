"""What `hfexport export` prints of validation by default: a line saying where and on which cases it
ran, one line per component (its worst output, that output's distance from eager, the bound it had to
meet, passed or failed) and the verdict. Every output of every case is in `report.json`
(`ValidationReport.to_dict`) and, with `--verbose`, printed as the table (`ValidationReport.to_table`).
"""

# NOTE: why the worst output is the one nearest its bound rather than the one with the largest
# difference: the tolerance is `atol + rtol * max|eager|`, so a logit off by 1e-4 in values of 30 is
# better than a cache value off by 5e-5 in values of 0.01. Each output's `max|eager|` is its
# `max_abs / max_rel`; under a cosine floor the nearest is the lowest cosine above its floor.

from __future__ import annotations

import math
from typing import Any

__all__ = ["component_line", "failing_rows", "header_line", "verdict_line"]

#: The most rows of failing outputs printed by default when validation fails (nothing is written, so
#: there is no report.json to read them in); `--verbose` prints them all.
FAILING_ROWS = 10


def header_line(reports: dict[str, Any]) -> str:
    """Where validation ran and on which cases, and where the whole table is."""
    runtimes = ", ".join(dict.fromkeys(report.runtime for report in reports.values()))
    cases = ", ".join(dict.fromkeys(case.label for report in reports.values() for case in report.cases))
    return (f"  validation:     against eager in {runtimes}, cases {cases or 'none'} "
            "(every output: report.json, or --verbose)")


def component_line(name: str, report: Any) -> str:
    """`name`'s line: passed or failed, its worst output, how far it is from eager, and the bound."""
    outputs = [o for case in report.cases for o in case.outputs]
    failed = [o for o in outputs if not o.passed]
    verdict = "passed" if report.passed else f"FAILED ({len(failed)} of {len(outputs)} outputs)"
    broken = next((case for case in report.cases if case.error), None)
    if broken is not None:  # the case did not run: no output to compare
        verdict = "FAILED"
        worst = f"the {broken.label} case did not run: {broken.error}"
    elif (found := _worst(report)) is None:
        worst = "no outputs compared"
    else:
        label, output = found
        worst = f"worst output {output.name} ({label} case): {_distance(report, output)}"
    note = f"; {report.note}" if report.note else ""
    return f"    {name + ':':<14}{verdict}; {worst}{note}"


def failing_rows(report: Any, limit: int = FAILING_ROWS) -> list[str]:
    """The table rows of `report`'s failing outputs (at most `limit`, then how many more)."""
    rows = [line for line in report.to_table().splitlines()[3:-1] if "FAIL" in line]
    if len(rows) > limit:
        rows = [*rows[:limit], f"  ... {len(rows) - limit} more failing (--verbose prints every output)"]
    return rows


def verdict_line(passed: bool) -> str:
    """The last line of an export's report."""
    return f"result: {'PASSED' if passed else 'FAILED'}"


def _worst(report: Any) -> tuple[str, Any] | None:
    """`(case label, output)` of the output nearest its bound (a failing one first), or None."""
    scored = [((not o.passed, _closeness(report, o)), case.label, o) for case in report.cases for o in case.outputs]
    if not scored:
        return None
    _, label, output = max(scored, key=lambda entry: entry[0])
    return label, output


def _closeness(report: Any, output: Any) -> float:
    """How near `output` is to its bound: 1.0 at the bound, more past it; inf for a mismatch
    without a distance (a shape, non-finite values)."""
    if math.isnan(output.max_abs) or output.max_abs == math.inf:
        return math.inf
    if report.min_cosine is not None and output.cosine is not None:
        return 2.0 - output.cosine + _floor(report, output)  # higher for a lower cosine above a higher floor
    scale = output.max_abs / output.max_rel if output.max_rel and math.isfinite(output.max_rel) else 0.0
    bound = report.atol + report.rtol * scale
    return output.max_abs / bound if bound > 0 else (0.0 if output.max_abs == 0 else math.inf)


def _floor(report: Any, output: Any) -> float:
    """The cosine floor `output` was held to (the cache's for a cache tensor)."""
    from ..validation.compare import is_cache_output

    if is_cache_output(output.name) and report.min_cache_cosine is not None:
        return report.min_cache_cosine
    return report.min_cosine


def _distance(report: Any, output: Any) -> str:
    """`output`'s distance from eager and the bound it had to meet, in words."""
    if output.error:
        return output.error
    if report.min_cosine is not None and output.cosine is not None:
        floor = _floor(report, output)
        if report.cosine_advisory:
            below = ", below it: reported, not failed" if output.below_floor else ""
            return f"cosine {output.cosine:.6f} (advisory floor {floor:g}{below})"
        return f"cosine {output.cosine:.6f} (floor {floor:g})"
    return f"max abs {output.max_abs:.3g} (tolerance atol={report.atol:g}, rtol={report.rtol:g})"
