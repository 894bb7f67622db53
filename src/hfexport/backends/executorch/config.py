"""`ExecutorchConfig`: options of the ExecuTorch backend."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from ...config import ExportConfig, check_choice, check_type

__all__ = ["ExecutorchConfig", "DELEGATES"]

#: The ExecuTorch delegates a program can be lowered to.
DELEGATES = ("xnnpack", "cuda", "mlx")


@dataclasses.dataclass
class ExecutorchConfig(ExportConfig):
    """Export to an `executorch.exir.ExecutorchProgramManager` (save with `.save("model.pte")`).

    Args:
        delegate: the delegate the program is lowered to: `"xnnpack"` (CPU, default), `"cuda"`
            (needs CUDA) or `"mlx"` (Apple Silicon, macOS 14+).
        backend: the original name of `delegate`, kept as a deprecated alias (it reads back as the
            delegate).
        alloc_graph_input: let memory planning allocate graph inputs; `False` makes the caller's
            input tensors the storage (in-place static cache).
        alloc_graph_output: likewise for graph outputs (bind them with `set_output_data_ptr`).
        alloc_mutable_buffers: likewise for mutable buffers.
        max_batch_size: upper bound given to memory planning for a dynamic batch dimension (and
            for the number of images of a vision tower that takes a variable number of them).
        max_image_patches: upper bound for a vision tower's variable patch count (Qwen2-VL's
            `(patches, C*T*P*P)` input); memory planning sizes attention for it, so it sets
            the largest image the program accepts (1024 patches of 14 px: about 448x448).
        max_sequence_length: upper bound for sequence-like dimensions (tokens, decoder tokens,
            cache length); default: the model config's position limit (`max_position_embeddings`,
            `max_target_positions`, or T5's `n_positions`; 4096 when it has none). Memory
            planning sizes every intermediate for it, so a model that materializes its attention
            scores needs a bound it can afford.
        external_weights: keep the weights outside the program, in ExecuTorch's named-data file
            `<name>.ptd` beside `<name>.pte`: `True` always (the program's own `save("model.pte")`
            then writes `model.ptd` beside it; load the pair with
            `_load_for_executorch(pte, data_path=ptd)` or the C++ `Module(pte, ptd)`: executorch
            1.4.1's `Runtime.load_program` takes no data file), `False` never. `None` (default):
            by size, `external_weights_over`. CLI `--external-weights` / `--no-external-weights`.
            XNNPACK only.
        external_weights_over: with `external_weights=None`, the weight bytes over which they go
            to the `.ptd`; `None` (default) keeps them in the `.pte` for what `export` returns.
            `export_to_folder` and the CLI (a folder with a manifest, whose runner maps both files)
            set 64 MiB (`hfexport.config.EXTERNAL_WEIGHTS_BYTES`) where it is `None`.
        llm_runner: what a generation export written to a folder (`export_to_folder`,
            `hfexport export --generate`) is: `None` (default) the one program ExecuTorch's own
            LLM runner (`TextLLMRunner`) loads, over a cache held in the program
            (`backends/executorch/llm_export.py`), where it can serve the model, else the
            components with the cache as method inputs, the report saying why; `True` that
            program or `PrepareError`; `False` the components. CLI `--llm-runner` /
            `--no-llm-runner`. The seed's `export_for_generation` always gives the components.
    """

    export_format = "executorch"

    delegate: str = "xnnpack"
    alloc_graph_input: bool = True
    alloc_graph_output: bool = True
    alloc_mutable_buffers: bool = True
    max_batch_size: int = 8
    max_image_patches: int = 1024
    max_sequence_length: int | None = None
    external_weights: bool | None = None
    external_weights_over: int | None = None
    llm_runner: bool | None = None
    backend: str | None = dataclasses.field(default=None, compare=False, repr=False)

    def _validate(self) -> None:
        if self.backend is not None and self.backend != self.delegate:
            if self.delegate != "xnnpack":
                raise ValueError(f"ExecutorchConfig got delegate={self.delegate!r} and backend={self.backend!r}; "
                                 "backend is the old name of delegate: pass delegate only")
            warnings.warn("ExecutorchConfig(backend=...) is the old spelling; use delegate=...", DeprecationWarning,
                          stacklevel=4)
            self.delegate = self.backend
        self.backend = self.delegate
        check_choice("ExecutorchConfig", "delegate", self.delegate, DELEGATES)
        for name in ("alloc_graph_input", "alloc_graph_output", "alloc_mutable_buffers"):
            check_type("ExecutorchConfig", name, getattr(self, name), bool)
        for name in ("max_batch_size", "max_image_patches"):
            check_type("ExecutorchConfig", name, getattr(self, name), int)
            if getattr(self, name) < 1:
                raise ValueError(f"ExecutorchConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.max_sequence_length is not None:
            check_type("ExecutorchConfig", "max_sequence_length", self.max_sequence_length, int)
            if self.max_sequence_length < 2:
                raise ValueError(f"ExecutorchConfig.max_sequence_length must be >= 2; got {self.max_sequence_length}")
        if self.external_weights is not None:
            check_type("ExecutorchConfig", "external_weights", self.external_weights, bool)
        if self.external_weights_over is not None:
            check_type("ExecutorchConfig", "external_weights_over", self.external_weights_over, int)
            if self.external_weights_over < 0:
                raise ValueError(f"ExecutorchConfig.external_weights_over must be >= 0; got {self.external_weights_over}")
        if self.llm_runner is not None:
            check_type("ExecutorchConfig", "llm_runner", self.llm_runner, bool)
        if self.external_weights and self.delegate != "xnnpack":
            raise ValueError(f"ExecutorchConfig(external_weights=True) files XNNPACK's weights outside the program; "
                             f"the {self.delegate} delegate keeps its own (executorch 1.4.1: CUDA writes them to its "
                             "own .ptd, MLX into the .pte): leave external_weights unset")

    def generation_options(self) -> list[str]:
        """`llm_runner=True`: it asks for a generation export's program."""
        return ["llm_runner"] if self.llm_runner else []

    def to_dict(self) -> dict[str, Any]:
        """As `ExportConfig.to_dict`, with the delegate under its name only (not the `backend` alias)."""
        out = super().to_dict()
        out.pop("backend", None)
        return out
