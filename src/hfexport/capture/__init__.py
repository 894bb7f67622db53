"""The capture step every backend shares, one module per concern:

- `prepare`: forward kwargs normalised, attention implementation checked, eval + `no_grad`;
- `interface`: which kwargs a program takes and under which names;
- `dynamic`: the dynamic-shapes plan handed to `torch.export`, and the check of what came out;
- `trace`: `torch.export` itself, the check step, FX fixes;
- `pytree`: caches and `ModelOutput`s as pytree nodes; `names`: readable I/O and dimension names.

Importing this package imports none of them.
"""

__all__ = ["prepare", "interface", "dynamic", "trace", "pytree", "names"]
