"""flashtile inside Hugging Face transformers: tiny random models against transformers' own attention.

Every model is built from a config (no downloads) in float64 on the CPU backend, so flashtile and eager/sdpa
agree to rounding; the GPU suite runs larger models in bf16.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from flashtile.integrations import transformers as integration  # noqa: E402

VOCAB = 97
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
# Llama with GQA; Mistral with a sliding window shorter than the sequences; Gemma 2 with softcap and
# alternating sliding/full layers; GPT-OSS with attention sinks (s_aux) and alternating windows. Each with
# the implementation it is compared against: sdpa runs float64 throughout but ignores softcap and sinks, so
# Gemma 2 and GPT-OSS are compared with eager, whose softmax runs in float32 (in float64 models it casts the
# mask's float64 minimum to −inf, so fully masked padding rows turn NaN and leak into real rows): they run
# in float32.
FAMILIES = {
    "llama-gqa": (transformers.LlamaConfig, {}, "sdpa"),
    "mistral-window": (transformers.MistralConfig, {"sliding_window": 4}, "sdpa"),
    "gemma2-softcap": (
        transformers.Gemma2Config,
        {"sliding_window": 4, "attn_logit_softcapping": 5.0, "head_dim": 8, "query_pre_attn_scalar": 8},
        "eager",
    ),
    "gpt-oss-sinks": (
        transformers.GptOssConfig,
        {"head_dim": 8, "num_local_experts": 2, "num_experts_per_tok": 1, "sliding_window": 4},
        "eager",
    ),
}
DTYPE = {"sdpa": torch.float64, "eager": torch.float32}
# Largest ‖ours − theirs‖ / ‖theirs‖ per tensor: float64 runs differ only by summation order, float32 ones
# by float32 rounding carried through two layers and back (elementwise bounds would trip on tiny entries).
RELATIVE_ERROR = {"sdpa": 1e-12, "eager": 1e-5}


@pytest.fixture(scope="module")
def name() -> str:
    return integration.register()


def _model(family: str, **overrides: object) -> torch.nn.Module:
    config_class, extra, reference = FAMILIES[family]
    config = config_class(**{**COMMON, **extra, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.to(DTYPE[reference]).eval()


def _logits_and_grads(
    model: torch.nn.Module, implementation: str, weights: torch.Tensor, keep: torch.Tensor, **inputs: object
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits at the kept positions and the parameter gradients of a weighted sum of them."""
    model.set_attn_implementation(implementation)
    model.zero_grad()
    logits = model(**inputs, use_cache=False).logits
    (logits * weights)[keep].sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits[keep].detach(), grads


def _assert_close(ours: torch.Tensor, theirs: torch.Tensor, reference: str, what: str) -> None:
    assert ours.shape == theirs.shape, f"{what}: shapes {tuple(ours.shape)} and {tuple(theirs.shape)}"
    # Gradients zero in exact arithmetic (a key bias under softmax) hold only rounding: divide by ≥ 1e-4.
    error = float((ours - theirs).norm() / theirs.norm().clamp(min=1e-4))
    worst = int((ours - theirs).abs().argmax())
    assert error <= RELATIVE_ERROR[reference], (
        f"{what}: relative error {error:.3g} > {RELATIVE_ERROR[reference]:g} against {reference}; worst "
        f"flat index {worst}: {ours.flatten()[worst].item():.9g} vs {theirs.flatten()[worst].item():.9g}"
    )


def _assert_grads_close(ours: dict, theirs: dict, reference: str) -> None:
    assert ours.keys() == theirs.keys()
    for n in theirs:
        _assert_close(ours[n], theirs[n], reference, f"grad of {n}")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_logits_and_gradients_match_transformers(name: str, family: str, padding: str, seed: int) -> None:
    model = _model(family)
    ids = torch.randint(0, VOCAB, (3, 11))
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[0, :4], mask[2, :1] = 0, 0
    elif padding == "right":
        mask[0, 7:], mask[1, 2:] = 0, 0
    keep = mask.bool()
    reference = FAMILIES[family][2]
    weights = torch.randn(*ids.shape, VOCAB, dtype=DTYPE[reference])
    inputs = {"input_ids": ids, "attention_mask": None if padding == "none" else mask}
    logits, grads = _logits_and_grads(model, name, weights, keep, **inputs)
    expected_logits, expected_grads = _logits_and_grads(model, reference, weights, keep, **inputs)
    _assert_close(logits, expected_logits, reference, "logits")
    _assert_grads_close(grads, expected_grads, reference)


@pytest.mark.parametrize("family", ["llama-gqa", "mistral-window"])
@pytest.mark.parametrize("boundaries", ["position_ids", "cu_seq_lens"])
def test_packed_batch_equals_sequences_one_by_one(name: str, family: str, boundaries: str, seed: int) -> None:
    model = _model(family)
    lengths = [5, 1, 9, 6]
    sequences = [torch.randint(0, VOCAB, (1, n)) for n in lengths]
    weights = [torch.randn(1, n, VOCAB, dtype=torch.float64) for n in lengths]

    model.set_attn_implementation("sdpa")
    model.zero_grad()
    alone = [model(input_ids=s, use_cache=False).logits for s in sequences]
    sum((a * w).sum() for a, w in zip(alone, weights, strict=True)).backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    inputs = {
        "input_ids": torch.cat(sequences, dim=1),
        "position_ids": torch.cat([torch.arange(n) for n in lengths])[None],
    }
    if boundaries == "cu_seq_lens":
        cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        inputs |= {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens}
        inputs |= {"max_length_q": max(lengths), "max_length_k": max(lengths)}
    model.set_attn_implementation(name)
    model.zero_grad()
    packed = model(**inputs, use_cache=False).logits
    (packed * torch.cat(weights, dim=1)).sum().backward()

    _assert_close(packed.detach(), torch.cat(alone, dim=1).detach(), "sdpa", "logits")
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    _assert_grads_close(grads, expected_grads, "sdpa")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_generate_gives_the_same_greedy_tokens(
    name: str, family: str, cache: str, padded: bool, seed: int
) -> None:
    model = _model(family)
    ids = torch.randint(0, VOCAB, (2, 7))
    mask = torch.ones_like(ids)
    # transformers drops an all-ones mask, so the unpadded static cache relies on padding_mask's filled slots.
    mask[1, :3] = 0 if padded else 1
    kwargs = {"max_new_tokens": 8, "do_sample": False, "cache_implementation": cache, "pad_token_id": 0}
    outputs = {}
    reference = FAMILIES[family][2]
    for implementation in (reference, name):
        model.set_attn_implementation(implementation)
        outputs[implementation] = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    assert torch.equal(outputs[name], outputs[reference])


@pytest.mark.parametrize("padding", ["none", "encoder-padded"])
def test_encoder_decoder_cross_attention_matches_sdpa(name: str, padding: str, seed: int) -> None:
    # Regressions: cross-attention once lost keys (an all-ones mask cut to the decoder's length) and queries
    # (the encoder's padding mask applied to the decoder's positions).
    config = transformers.BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        max_position_embeddings=64,
    )
    model = transformers.AutoModelForSeq2SeqLM.from_config(config).double().eval()
    source, target = torch.randint(3, VOCAB, (2, 11)), torch.randint(3, VOCAB, (2, 5))
    mask = torch.ones_like(source)
    if padding == "encoder-padded":
        mask[0, 8:] = 0
    weights = torch.randn(*target.shape, VOCAB, dtype=torch.float64)
    keep = torch.ones_like(target, dtype=torch.bool)
    inputs = {"input_ids": source, "attention_mask": mask, "decoder_input_ids": target}
    logits, grads = _logits_and_grads(model, name, weights, keep, **inputs)
    expected_logits, expected_grads = _logits_and_grads(model, "sdpa", weights, keep, **inputs)
    _assert_close(logits, expected_logits, "sdpa", "logits")
    _assert_grads_close(grads, expected_grads, "sdpa")


def test_from_pretrained_selects_flashtile(name: str, tmp_path: object, seed: int) -> None:
    _model("llama-gqa").save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=name)
    assert model.config._attn_implementation == name
    ids = torch.randint(0, VOCAB, (2, 5))
    logits = model(ids).logits
    model.set_attn_implementation("sdpa")
    _assert_close(logits.detach(), model(ids).logits.detach(), "sdpa", "logits")


def test_dropout_reaches_flashtile_in_training_only(name: str, seed: int) -> None:
    model = _model("llama-gqa", attention_dropout=0.5)
    model.set_attn_implementation(name)
    ids = torch.randint(0, VOCAB, (2, 9))
    evaluated = model(ids).logits
    model.train()
    torch.manual_seed(seed)
    first = model(ids).logits
    torch.manual_seed(seed)
    assert torch.equal(model(ids).logits, first)
    assert not torch.allclose(first, evaluated)


def test_attention_sinks_are_trained_through_flashtile(name: str, seed: int) -> None:
    model = _model("gpt-oss-sinks")
    sinks = [m.sinks for m in model.modules() if hasattr(m, "sinks")]
    assert sinks and all(bool(s.abs().sum() > 0) for s in sinks)
    model.set_attn_implementation(name)
    model(torch.randint(0, VOCAB, (2, 7))).logits.sum().backward()
    assert all(s.grad is not None and bool(s.grad.abs().sum() > 0) for s in sinks)


def test_chunked_attention_longer_than_a_chunk_raises_a_clear_error(name: str, seed: int) -> None:
    config = transformers.Llama4TextConfig(
        **COMMON, head_dim=8, intermediate_size_mlp=48, num_local_experts=2, attention_chunk_size=4
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=name)
    model(torch.randint(0, VOCAB, (1, 4)))
    with pytest.raises(NotImplementedError, match=r"chunked attention \(attention_chunk_size=4 < 9 keys\)"):
        model(torch.randint(0, VOCAB, (1, 9)))


def test_a_four_dimensional_mask_raises_a_clear_error(name: str) -> None:
    model = _model("llama-gqa")
    model.set_attn_implementation(name)
    mask = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="4-D attention mask"):
        model(torch.randint(0, VOCAB, (1, 5)), attention_mask=mask)


@pytest.mark.parametrize("bad", ["flashtile", "flash_attention_2", "", "sdpa", "paged|tile", 3])
def test_register_rejects_names_transformers_would_not_route_here(bad: object) -> None:
    with pytest.raises(ValueError, match="name must"):
        integration.register(bad)


def test_importing_flashtile_and_the_integration_leaves_transformers_unimported() -> None:
    code = "import sys, flashtile.integrations.transformers; assert 'transformers' not in sys.modules"
    src = str(Path(integration.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_register_names_the_extra_when_transformers_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ModuleNotFoundError, match=r"flashtile\[transformers\]"):
        integration.register()


def test_packed_boundaries_are_found_once_per_position_ids_tensor():
    # Every layer gets the same position_ids: its boundaries (two host syncs on a GPU) are found once.
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    first = integration._packed_boundaries(position_ids, 1)
    assert integration._packed_boundaries(position_ids, 1) is first
    assert first[0].tolist() == [0, 3, 5, 9] and first[1] == 4
    # An in-place change bumps the tensor's version: the boundaries are found again.
    position_ids[0, 5:] = torch.arange(3, 7)
    again = integration._packed_boundaries(position_ids, 1)
    assert again[0].tolist() == [0, 3, 9] and again[1] == 6
    assert integration._packed_boundaries(torch.arange(9)[None], 1) is None
