"""A differential fuzzer: random tiny text decoders, exported with `dynamic=True`, run in their
runtime and compared with eager PyTorch, hunting silent specialisation and numeric mismatches.

    python -m hfexport.fuzz --examples 500 --backends dynamo,onnx,openvino,executorch --seed 0
    hfexport fuzz --examples 20 --backends dynamo --seed 3 --report /tmp/fuzz_findings.md

One example (drawn by hypothesis, see `examples`) is a preset text decoder whose config is
perturbed within what its architecture allows (heads, key/value heads, head_dim, layers,
vocabulary, sliding window, rope scaling, tied embeddings, pad/bos/eos ids), a prompt (batch,
length, left padding), a cache (dynamic, or static of `max_cache_len`), multi-token decode on or
off, and a backend. It is checked in two parts:

- `export`: `exporter.export(model, inputs)`, `validate` at the sample and two resized shapes,
  then the artifact run by the fuzzer itself at one more drawn shape (its own resizing, so a bug
  in `validate`'s cannot hide one in the export);
- `generate`: `decompose_for_generation` -> `export_components` -> `validate_components`, the
  export saved and driven by `GenerationRunner` (tokens and every step's logits against
  `model.generate`), and for a static cache with multi-token decode the one `decode` graph driven
  as the docs' loops drive it (`drive_decode_loop`).

Outcomes: *passed*; *refused*: the library declined with an `ExportError` while exporting, and
its remedy is a real alternative (not "rerun with --debug" or "please report"); *failed*:
anything else (an exception, a failed validation, a token or logits mismatch). A silent wrong
answer is always a failure. Failures are told apart by stage, kind and `Failure.signature` (an
error's first line with sizes, symbols and model names blanked; for a mismatch, what differs and
on which architecture). Each new one is shrunk by hypothesis (at most `--shrink-budget` runs per
round, only the part that failed) and printed as a ready-to-paste Python reproduction; the next
round (a new seed) hunts on until `--examples` examples have run. Outcomes are remembered, so an
example hypothesis draws again is not run again.

Examples run in this process: a runtime that crashes the interpreter (a segfault) ends the run.

The package, in the order a run goes: `example` (what is drawn: `Arch`, `Example`, the strategies),
`outcomes` (`Failure`, `Outcome`, `signature`), `checks` (`run_example`), `reproductions`, `driver`
(`fuzz`: the rounds, shrinking, the summary) and `command` (`python -m hfexport.fuzz`).
"""

# NOTE: the modules are named for their concern and never for a function the package exports
# (`example`, not `examples`; `reproductions`, not `reproduction`): a submodule of the same name
# would be shadowed by the function here, and `hfexport.fuzz.examples` must stay the strategy.
from ..config import BUILTIN_FORMATS
from .checks import (EXPORT_STAGES, GENERATE_STAGES, STEP_ATOL, STEP_RTOL, VALIDATE_STEPS, compare_steps,
                     drive_decode_loop, run_example)
from .command import add_arguments, main, options_from_args, replay, run
from .driver import Finding, FuzzOptions, FuzzSummary, fuzz
from .example import (ARCHS, DEFAULT_ARCHS, MODES, OPEN_FINDINGS, Arch, Example, build_example, config_overrides,
                      examples, sample_inputs)
from .outcomes import Failure, Outcome, signature
from .reproductions import replay_command, reproduction

#: The backends the fuzzer can draw: the built-in export formats (`--backends`).
BACKENDS = BUILTIN_FORMATS

__all__ = ["ARCHS", "Arch", "Example", "Failure", "Outcome", "Finding", "FuzzOptions", "FuzzSummary",
           "config_overrides", "examples", "build_example", "sample_inputs", "run_example", "compare_steps",
           "drive_decode_loop", "reproduction", "replay_command", "signature", "fuzz", "add_arguments",
           "options_from_args", "replay", "run", "main", "BACKENDS", "MODES", "DEFAULT_ARCHS", "OPEN_FINDINGS",
           "EXPORT_STAGES", "GENERATE_STAGES", "VALIDATE_STEPS", "STEP_ATOL", "STEP_RTOL"]
