"""ONNX Runtime's session options as `OnnxRunner` sets them: `SESSION_CONFIG` over ONNX Runtime's
defaults, and a typed override in `$HFEXPORT_ORT_SESSION_CONFIG`.

The override is a JSON object. A dotted key (`session.intra_op.allow_spinning`) is a session config
entry, its value a string (a number or `true`/`false` is written as ONNX Runtime reads it: `1`,
`0`); another key is one of the `SessionOptions` attributes of `SESSION_ATTRIBUTES`, with a value
of its type; `null` drops a key. Anything else is a `RuntimeLoadError` that names the key and what
is accepted.

# NOTE: why the session does not spin by default (`SESSION_CONFIG`), where ONNX Runtime's own
# default is to: between two runs its intra-op workers spin-wait for the next parallel section,
# and a generation loop runs Python between every two runs, on the same cores. On this 2-CPU
# machine with other processes on it, the random Llama's decode graph (`bench/onnx_genai.py`, 8
# layers, cache 256) ran 30 tok/s in a bare IO-binding loop with ORT's defaults (2 spinning
# threads), 91-110 with `session.intra_op.allow_spinning=0`, and onnxruntime-genai's `Generator`
# on the same file 50 (it runs one intra-op thread here: it sets `hardware_concurrency() / 2`).
# The thread count stays ONNX Runtime's (what its users get, and the faster on a free machine);
# `{"intra_op_num_threads": 1}` is onnxruntime-genai's here, steadier when the cores are shared.
# The options the runner set are in `OnnxRunner.session_config` and the record
# (`details["ort_session"]`).
#
# NOTE: why a table of attributes rather than any `SessionOptions` attribute: an override is read
# from the environment, so a typo or a wrong type must fail with what to write, not be set as
# given (ONNX Runtime's binding raises a bare TypeError, or takes a string where an enum belongs
# later); and the attributes that write files (`optimized_model_filepath`, `enable_profiling`,
# `profile_file_prefix`) are left out: a variable that tunes a runner should not write beside the
# user's files.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from ...errors import RuntimeLoadError
from ...runner import json_object_from_env

__all__ = ["SESSION_ATTRIBUTES", "SESSION_CONFIG", "SESSION_CONFIG_ENV", "apply_session_config", "session_config"]

#: what the runner sets over ONNX Runtime's session defaults (see the module's NOTE)
SESSION_CONFIG: dict[str, Any] = {"session.intra_op.allow_spinning": "0"}
#: an environment variable holding a JSON object merged over `SESSION_CONFIG`
SESSION_CONFIG_ENV = "HFEXPORT_ORT_SESSION_CONFIG"
#: the `SessionOptions` attributes an override may set, and their type: `int` (at least 0), `bool`,
#: or the name of an onnxruntime enum whose member names are the values (`"ORT_PARALLEL"`)
SESSION_ATTRIBUTES: dict[str, str] = {
    "intra_op_num_threads": "int",
    "inter_op_num_threads": "int",
    "execution_mode": "ExecutionMode",
    "graph_optimization_level": "GraphOptimizationLevel",
    "enable_cpu_mem_arena": "bool",
    "enable_mem_pattern": "bool",
    "enable_mem_reuse": "bool",
    "use_deterministic_compute": "bool",
    "log_severity_level": "int",
    "log_verbosity_level": "int",
}
_EXAMPLE = '{"session.intra_op.allow_spinning": "1", "intra_op_num_threads": 1}'


def session_config() -> dict[str, Any]:
    """`SESSION_CONFIG` with `$HFEXPORT_ORT_SESSION_CONFIG` over it (a value `null` drops a key),
    each value checked and in the form the record stores (JSON: enum members by name)."""
    config = dict(SESSION_CONFIG)
    overrides = json_object_from_env(SESSION_CONFIG_ENV, _EXAMPLE)
    for key, value in (overrides or {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = _checked(key, value)
    return config


def apply_session_config(options: Any, config: dict[str, Any]) -> Any:
    """`options` (an `onnxruntime.SessionOptions`) with `config`'s entries set: dotted keys as
    session config entries, other keys as the `SESSION_ATTRIBUTES` they name."""
    import onnxruntime as ort

    for key, value in config.items():
        value = _checked(key, value)
        if "." in key:
            options.add_session_config_entry(key, value)
        elif SESSION_ATTRIBUTES[key] in ("int", "bool"):
            setattr(options, key, value)
        else:
            setattr(options, key, getattr(getattr(ort, SESSION_ATTRIBUTES[key]), value))
    return options


def _checked(key: str, value: Any) -> Any:
    """`value` for `key` in the form `session_config` returns, or a `RuntimeLoadError` saying what
    `key` accepts."""
    if "." in key:
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, (str, int, float)):
            return str(value)
        _refuse(key, value, "a session config entry's value is a string (or a number, true, false)")
    kind = SESSION_ATTRIBUTES.get(key)
    if kind is None:
        _refuse(key, value, f"it is neither a dotted session config entry nor one of the SessionOptions attributes "
                f"{SESSION_CONFIG_ENV} may set: {_accepted()}")
    if kind == "bool":
        if not isinstance(value, bool):
            _refuse(key, value, f"{key} is true or false")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            _refuse(key, value, f"{key} is an integer, at least 0")
        return value
    members = _members(kind)
    if value not in members:
        _refuse(key, value, f"{key} is the name of an onnxruntime.{kind}: {' | '.join(members)}")
    return value


def _members(enum: str) -> list[str]:
    import onnxruntime as ort

    return list(getattr(ort, enum).__members__)


def _accepted() -> str:
    return ", ".join(f"{key} ({kind})" for key, kind in SESSION_ATTRIBUTES.items())


def _refuse(key: str, value: Any, rule: str) -> NoReturn:
    raise RuntimeLoadError(f"{SESSION_CONFIG_ENV}: {key!r} = {json.dumps(value)} is refused: {rule}",
                           remedy=f"write it as a JSON object of those keys, e.g. {_EXAMPLE}")
