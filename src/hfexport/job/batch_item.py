"""One export of a batch (`hfexport.job.batch`), run as `python -m hfexport.job.batch_item SPEC FORMAT OUT`.

`SPEC` is the JSON of one list entry (`{"model": "tiny:llama", "generate": true}`, `BatchItem.spec`;
its options by their own names, `batch.OPTIONS`, which `BatchItem.job_options` groups). The export job
(`hfexport.job.export.export_to_folder`) writes `OUT` as `hfexport export` would, validation included.
Prints `STAGE <name>` lines as it goes and one final `RESULT <json>` line; never raises: a failure
becomes status `failed` with the error's first line (and its traceback on stderr).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

from hfexport.errors import first_line
from hfexport.job.executors import StageLines


def export(spec: dict[str, Any], fmt: str, out: str) -> dict[str, Any]:
    """Export `spec["model"]` to `fmt` into `out`; return the status and the artifact bytes."""
    from hfexport.auto import AutoExportConfig
    from hfexport.job.batch import BatchItem
    from hfexport.job.export import export_to_folder

    options = dict(spec)
    item = BatchItem(options.pop("model"), options)
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": options.get("dynamic", True)})
    result = export_to_folder(item.model, config, out, item.job_options(), progress=StageLines())
    return {"status": "ok", "detail": None, "artifact_bytes": result.report.get("artifact_bytes")}


def main(argv: list[str]) -> int:
    """Run one export (`SPEC FORMAT OUT`), print its `RESULT` line; always 0."""
    spec, fmt, out = argv
    start = time.perf_counter()
    try:
        result = export(json.loads(spec), fmt, out)
    except Exception as error:  # noqa: BLE001 - an export never raises; the traceback goes to stderr
        traceback.print_exc()
        result = {"status": "failed", "detail": first_line(error)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
