"""The coverage matrix: which architectures export to which runtime, and give eager's numbers.

`hfexport coverage` builds every tiny model of `hfexport.presets` (one per architecture), and for
each backend x mode runs one case in its own subprocess (`hfexport.coverage.case`) with a timeout,
so a crash or a hang costs one cell, not the sweep. A case exports, runs the artifact in its
runtime and compares it with eager:

- `export`: the whole model as one graph, `dynamic=True`, at the sample shape and at a second
  batch size and sequence length (validation's resized case);
- `generate`: `export_for_generation`, every component against its eager submodule, then greedy
  tokens from the saved export through `GenerationRunner` against `model.generate` (text models and
  speech encoder-decoders, on the sample inputs; an image-text or audio-text model's components only);
- `generate-image`: the same, an image-text model's greedy tokens from its prompt's image;
- `generate-audio`: the same, a speech encoder-decoder's or an audio-text LLM's greedy tokens from
  two generated clips through the saved processor (`GenerationRunner.generate_from_audio`).

Statuses: `ok`, `export failure`, `runtime failure`, `mismatch`, `timeout`, `crash`, and for the
declared cases of `KNOWN_FAILURES` `known failure` (or `unexpected pass` when one starts to work).
`KNOWN_FAILURES` (`hfexport.coverage.known_failures`) is the one table of known failures: the
test suite's strict xfails read it too.
"""

from .known_failures import KNOWN_FAILURES, KnownFailure
from .matrix import (CaseResult, applicable, load_results, merge_results, render_markdown, run_case, run_matrix,
                     save_results)

__all__ = ["KNOWN_FAILURES", "CaseResult", "KnownFailure", "applicable", "load_results", "merge_results",
           "render_markdown", "run_case", "run_matrix", "save_results"]
