"""Weights outside the program: an ExecuTorch named-data file (`<stem>.ptd`) beside `<stem>.pte`.

```
_convert: tag_delegated_weights (edge transform pass)  -> XNNPACK puts its weights under WEIGHTS_TAG
          ExecutorchBackendConfig(external_constants=)   -> so does the emitter, for the other constants
_write:   write_to_file(.pte stream) + write_tensor_data_to_file (ExecuTorch's writer) -> <stem>.ptd
load:     check_data_file (present, same fingerprint)  -> the runner maps private copies of both
```
"""

# NOTE: why ExecuTorch's own tags rather than writing the weights ourselves. ExecuTorch 1.4.1 (read
# from `exir/passes/external_constants_pass.py`, `backends/xnnpack/operators/node_visitor.py`,
# `exir/_serialize/_serialize.py`) has two switches: `ExecutorchBackendConfig(external_constants=fn)`
# tags the constants left on portable kernels (the emitter stores them by name outside the program),
# and XNNPACK's serializer reads `node.meta["custom"]["delegate_constant_tag"]` on each weight and
# passes it to `NamedDataStore.add_named_data(external_tag=...)`. Both land in one `.ptd` per tag
# (`serialize_for_executorch` merges them), which the runtime reads as a `NamedDataMap`. ExecuTorch's
# LLM export sets the delegate tag on the unlifted module and exports it again
# (`delegate_external_constants_pass_unlifted`); here it is set on the edge program by a transform
# pass, before partitioning, which copies the placeholders' meta into each delegate's subgraph
# (`fuse_as_graphmodule`): no second trace.
#
# The fingerprint is the `.ptd`'s size and a sha256 of its first and last MiB, which the record
# carries so that a program loaded without its folder's manifest (`ExecutorchExporter().load([pte,
# ptd])`) still refuses another export's weights. The first MiB holds the file's flatbuffer, which
# lists XNNPACK's keys, each the sha256 of a weight's bytes: a `.ptd` of other weights differs
# there, even in a model of the same shapes. An export folder's manifest checks the whole file.

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ...errors import RuntimeLoadError, SerializationError
from ...folder.storage import fingerprint
from .compat import data_payloads

__all__ = ["WEIGHTS_TAG", "check_data_file", "external_reason", "tag_delegated_weights", "weight_bytes",
           "weights_tag", "write_ptd"]

#: The named-data tag every weight is filed under (ExecuTorch names the file after it; `write_ptd`
#: renames it `<stem>.ptd`: the program looks its data up by key, not by file name).
WEIGHTS_TAG = "weights"



def weight_bytes(program: torch.export.ExportedProgram) -> int:
    """The bytes of `program`'s parameters, buffers and constants (a tensor held twice counted once)."""
    tensors = {id(t): t for t in [*program.state_dict.values(), *program.constants.values()]
               if isinstance(t, torch.Tensor)}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def external_reason(config: Any, program: torch.export.ExportedProgram) -> str | None:
    """Why `program`'s weights go outside it under `config` (an `ExecutorchConfig`), or `None`.

    `external_weights=True` always; `None` keeps them in the program unless they are over
    `external_weights_over` bytes, which an export folder sets to `hfexport.config.EXTERNAL_WEIGHTS_BYTES`
    (64 MiB, the threshold ONNX's `.data` uses too; `ExecutorchRuntimePackage.folder_config`): a
    single `.pte` is a single allocation for any loader that takes bytes (the program held whole in
    memory beside the weights XNNPACK packs from it) and a data file can be memory-mapped instead.
    Only the XNNPACK delegate files its weights under the tag (`ExecutorchConfig` refuses `True`
    for the others).

    # NOTE: why `None` means "in the `.pte`" for `export`: the program it returns is saved with its
    # own `save("model.pte")` and loaded with `executorch.runtime`, whose 1.4.1 `load_program`
    # takes no data file (a `.pte` whose weights are elsewhere fails `load_method`, "external_data_map
    # is null", error 0x2). An export folder lists both files in its manifest and the runner maps both.
    """
    if config.external_weights is False or config.delegate != "xnnpack":
        return None
    if config.external_weights:
        return "ExecutorchConfig(external_weights=True)"
    size, over = weight_bytes(program), config.external_weights_over
    if over is None or size <= over:
        return None
    return (f"{_bytes(size)} of weights, over the {_bytes(over)} of ExecutorchConfig(external_weights_over=...) "
            "(an export folder's default) under external_weights=None")


def _bytes(count: int) -> str:
    return f"{count / 2**20:,.0f} MiB" if count >= 2**20 else f"{count:,} bytes"


def weights_tag(node: torch.fx.Node) -> str:
    """`ExecutorchBackendConfig(external_constants=...)`: every constant left outside a delegate
    goes to the weights file."""
    return WEIGHTS_TAG


def tag_delegated_weights() -> Any:
    """An `ExportedProgramPassBase` (for `to_edge_transform_and_lower(transform_passes=[...])`, after
    folding) that files the weights a delegate will serialize under `WEIGHTS_TAG`: every constant
    placeholder (parameters, buffers not written in place, lifted constants). Quantized weights need
    nothing more: with PT2E's `int8-dynamic` and torchao's 8da4w on the tiny Llama, every weight
    byte reached the `.ptd` (executorch 1.4.1)."""
    from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

    class TagDelegatedWeights(ExportedProgramPassBase):
        def call(self, exported_program):
            signature = exported_program.graph_signature
            written = set(signature.buffers_to_mutate.values())
            constants = {**signature.inputs_to_parameters, **signature.inputs_to_lifted_tensor_constants,
                         **{name: fqn for name, fqn in signature.inputs_to_buffers.items() if fqn not in written}}
            weights = [node for node in exported_program.graph.nodes
                       if node.op == "placeholder" and node.name in constants]
            for node in weights:
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = WEIGHTS_TAG
            return ExportedProgramPassResult(exported_program, bool(weights))

    return TagDelegatedWeights()


def write_ptd(program: Any, path: Path) -> Path:
    """Write the named-data file of `program` (an `ExecutorchProgramManager`) to `path`, in a folder
    the caller stages, with ExecuTorch's writer (each weight streamed from where it is held, no
    contiguous copy): into a scratch folder beside `path`, then renamed."""
    payloads = data_payloads(program)
    if len(payloads) != 1:
        raise SerializationError(
            f"the ExecuTorch program has {len(payloads)} named-data files ({', '.join(payloads) or 'none'}); "
            f"{path.name} holds one",
            remedy="export with ExecutorchConfig(external_weights=False), and report this to hfexport")
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    try:
        program.write_tensor_data_to_file(str(scratch))
        [written] = scratch.iterdir()
        os.replace(written, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return path


def check_data_file(program: Any, recorded: dict[str, Any], model: str) -> None:
    """Refuse (`RuntimeLoadError`, naming both files) the weights of `program` (a `PteBuffer`)
    unless they are the `.ptd` its export recorded (`recorded`: the record's `external_weights`,
    with the file's name and fingerprint): missing, or from another export."""
    name = recorded.get("file", "its .ptd")
    program_name = program.path.name if program.path is not None else "the program"
    if program.data_path is None:
        raise RuntimeLoadError(
            f"the ExecuTorch program {program_name} keeps its weights in {name}; no data file was given",
            model=model,
            remedy=f"keep {name} beside {program_name} (every file manifest.json lists belongs to the export) and "
            "load both, or export again")
    if "sha256_ends" in recorded:
        found = fingerprint(program.data_path)
        if found != {"bytes": recorded["bytes"], "sha256_ends": recorded["sha256_ends"]}:
            raise RuntimeLoadError(
                f"{program.data_path.name} is not the weights file {program_name} was exported with: it has "
                f"{found['bytes']:,} bytes (sha256 of its ends {found['sha256_ends'][:12]}...), the export wrote "
                f"{recorded['bytes']:,} ({recorded['sha256_ends'][:12]}...)",
                model=model,
                remedy=f"use the {name} written with {program_name} by the same export, or export again")
