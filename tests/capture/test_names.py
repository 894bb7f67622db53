"""`dim_names`: one readable name per dimension of the interface (shapes as torch 2.13 records them)."""

from __future__ import annotations

from hfexport.capture.names import dim_names, rename_expression


def _cache(layers: int, keys: list, values: list, *, batch="s11", prefix="input.cache") -> tuple[list, list]:
    names = [f"{prefix}.{i}.{t}" for i in range(layers) for t in ("keys", "values")]
    shapes = [(batch, 2, length, 8) for i in range(layers) for length in (keys[i], values[i])]
    return names, shapes


def test_a_static_caches_keys_and_values_share_cache_length():
    """The static-cache decode graph: keys tied to the mask (`s10`), each layer's values apart
    (scaled-dot-product attention never checks their length against the keys')."""
    names, shapes = _cache(2, ["s10", "s10"], ["s0", "s31"], batch=1)
    mapping = dim_names(["input_ids", "attention_mask", *names], [(1, "s69"), (1, 1, "s69", "s10"), *shapes])
    assert mapping == {"s69": "sequence", "s10": "cache_length", "s0": "cache_length", "s31": "cache_length"}


def test_values_join_keys_whose_length_the_program_fixed():
    """A sliding window's keys traced at a fixed length, its values symbolic: both layers' values
    are that length, so one name."""
    names, shapes = _cache(2, [3, 3], ["s0", "s31"])
    mapping = dim_names(["input_ids", *names], [("s11", 1), *shapes])
    assert mapping == {"s11": "batch", "s0": "cache_length", "s31": "cache_length"}


def test_layers_whose_lengths_may_differ_keep_apart():
    """A sliding layer beside a full one: different sizes keep different names."""
    names, shapes = _cache(2, ["s5", "s31"], ["s6", "s31"])
    mapping = dim_names(names, shapes)
    assert mapping["s5"] == mapping["s6"] == "cache_length"
    assert mapping["s31"] == "cache_1_keys_cache_length"


def test_an_encoder_decoder_step_every_batch_and_the_encoders_length():
    """T5's decode step: the mask broadcasts over the batch (its own symbol), the encoder states
    go unused (their own length symbol); the cross-attention cache is the encoder's length."""
    cross, cross_shapes = _cache(2, ["s21", "s21"], ["s3", "s58"], prefix="input.cache.cross_attention")
    own, own_shapes = _cache(2, ["s51", "s51"], ["s2", "s13"], prefix="input.cache.self_attention")
    mapping = dim_names(["decoder_input_ids", "attention_mask", "encoder_outputs.last_hidden_state", *cross, *own],
                        [("s11", 1), ("s43", "s21"), ("s11", "s97", "s16"), *cross_shapes, *own_shapes])
    assert mapping["s11"] == mapping["s43"] == "batch"
    assert {mapping[s] for s in ("s21", "s97", "s3", "s58")} == {"sequence"}
    assert {mapping[s] for s in ("s51", "s2", "s13")} == {"cache_length"}
    assert rename_expression("s2 + 1", mapping) == "cache_length + 1"


def test_image_batches_are_not_the_text_batch():
    mapping = dim_names(["input_ids", "pixel_values"], [("s0", "s1"), ("s2", 3, 224, 224)])
    assert mapping["s0"] == "batch" and mapping["s2"] == "pixel_values_batch"
