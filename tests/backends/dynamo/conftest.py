"""Saved programs the archive tests tamper with."""

from __future__ import annotations

import pytest

from hfexport.backends.dynamo.artifact import write_program


@pytest.fixture(scope="module")
def saved_llama(dynamic_llama, tmp_path_factory):
    """`(model, inputs, path)`: the tiny Llama's dynamic `torch.export` program, saved as hfexport saves it."""
    model, inputs, program = dynamic_llama("dynamo")
    path = write_program(program, tmp_path_factory.mktemp("archive") / "model.pt2")
    return model, inputs, path


@pytest.fixture(scope="module")
def saved_decode(saved_generation):
    """The decode program of the tiny Llama's generation export: its inputs hold a `DynamicCache`."""
    return saved_generation("dynamo", "llama").directory / "decode.pt2"
