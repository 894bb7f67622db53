"""`bench/export_vs_vendor.py`'s table of rounds (`--rounds`, `--baseline`): each round's ratio is
ours over the vendor's row of the same round, and the verdict is their median's."""

from __future__ import annotations

import sys
from pathlib import Path

from hfexport.timing import PHASES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import export_vs_vendor  # noqa: E402


def _row(tool: str, wall: float, round_: int, **more) -> dict:
    row = {"format": "onnx", "scheme": "fp32", "tool": tool, "wall": wall, "peak_mb": 1900, "rc": 0,
           "weight_bytes": 1 << 30, "load": 1.0, "imports_mb": 300, "round": round_}
    if tool != "builder":
        row["phases"] = dict.fromkeys(PHASES, 1.0)
    return {**row, **more}


def test_each_rounds_ratio_is_against_the_same_rounds_vendor_row_and_the_verdict_is_the_median():
    rows = [_row("builder", 10.0, 1), _row("ours", 19.0, 1), _row("baseline", 21.0, 1),
            _row("builder", 8.0, 2), _row("ours", 18.0, 2), _row("baseline", 20.0, 2),
            _row("builder", 12.0, 3), _row("ours", 21.0, 3), _row("baseline", 26.0, 3)]
    table = export_vs_vendor.markdown({"started": "now", "ended": "later", "weight_bytes": 1 << 30, "rows": rows})
    lines = table.splitlines()
    vendor = "| onnx | fp32 | {} | 10.0, 8.0, 12.0 | "
    assert vendor.format("ours") + "19.0, 18.0, 21.0 | 1.90, 2.25, 1.75 | 1.90x | met (<= 2x) |" in lines
    assert vendor.format("baseline") + "21.0, 20.0, 26.0 | 2.10, 2.50, 2.17 | 2.17x | **miss** (<= 2x) |" in lines
    # the per-row table names the round, and each of ours is judged against its own round's vendor row
    assert any(line.startswith("| onnx | fp32 | ours (round 2) | 18.0 |") and "| 2.25x |" in line for line in lines)
    assert any(line.startswith("| onnx fp32 (baseline) round 3 | 26.0 |") for line in lines)


def test_one_round_prints_no_rounds_table():
    rows = [{**_row("builder", 10.0, 1), "round": None}, {**_row("ours", 19.0, 1), "round": None}]
    table = export_vs_vendor.markdown({"started": "now", "ended": "later", "weight_bytes": 1 << 30, "rows": rows})
    assert "Rounds (" not in table and "| onnx | fp32 | ours | 19.0 |" in table and "| 1.90x |" in table


def test_a_round_whose_vendor_row_failed_is_left_out_of_the_median():
    failed = {k: v for k, v in _row("builder", 0.0, 2).items() if k != "wall"}
    rows = [_row("builder", 10.0, 1), _row("ours", 19.0, 1), {**failed, "error": "exit 1: boom"},
            _row("ours", 30.0, 2), _row("builder", 12.0, 3), _row("ours", 21.0, 3)]
    table = export_vs_vendor.markdown({"started": "now", "ended": "later", "weight_bytes": 1 << 30, "rows": rows})
    assert "| onnx | fp32 | ours | 10.0, 12.0 | 19.0, 21.0 | 1.90, 1.75 | 1.82x | met (<= 2x) |" in table.splitlines()
