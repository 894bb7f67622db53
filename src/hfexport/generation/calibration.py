"""Calibration samples of generation components: each component's inputs on every calibration prompt.

A quantizer that runs on data (a static scheme, NNCF's AWQ or scale estimation) calibrates each
generation component (prefill, decode, ...) on the inputs that component takes, not on the model's
forward kwargs. They are captured by the same eager `generate()` run that finds the components
(`decompose.planned_components`), once per prompt, so the decode steps are captured too.

Memory: only the captured kwargs of each component are kept per prompt (the token ids, masks,
positions and the cache the component takes); each run's other state is dropped before the next.
A static cache is held at its full length per prompt and component, since that is what the
component takes.

# NOTE: why a capture per prompt rather than one prompt: one prompt's activation ranges are the
# ranges of a dozen tokens; ONNX `int8-static` of SmolLM2-135M calibrated on the sample prompt
# alone agreed with eager on ~11-16% of greedy steps (tests/test_real_llm.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..errors import PrepareError

__all__ = ["captured_calibration"]


def captured_calibration(capture: Callable[[Any], dict[str, Any]], plan: Any,
                         prompts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """`{component: [its captured kwargs, one per prompt]}`: `capture(plan)` (the eager capture
    that found the components) run once per prompt of `prompts` (tokenizer outputs).

    Raises:
        PrepareError: the plan holds components the backend built itself (`plan.components`),
            which cannot be captured again on other prompts; or a prompt's capture gives other
            components than the export's.
    """
    from .components import interface_kwargs

    if plan.components is not None:
        raise PrepareError("this backend builds its generation program itself, from the sample prompt only; "
                           "calibrating it on other prompts is not wired",
                           remedy="export its generation components, or choose a dynamic or weight-only scheme")
    captured: dict[str, list[dict[str, Any]]] = {}
    for prompt in prompts:
        components = capture(dataclasses.replace(plan, inputs=prompt))
        if captured and set(components) != set(captured):
            raise PrepareError(f"a calibration prompt gave the components {sorted(components)}, the export "
                               f"{sorted(captured)}", remedy="report this model class; it needs support")
        for name, (_module, kwargs) in components.items():
            captured.setdefault(name, []).append(interface_kwargs(kwargs))
    return captured
