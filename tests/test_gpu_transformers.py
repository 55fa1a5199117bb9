"""flashtile inside transformers on a CUDA device: larger random models in bf16, by flash-attention's rule.

The truth is the same model in float32 with ``sdpa``; flashtile's bf16 error against it must be at most
2× (logits) or 3× (parameter gradients) the error of ``sdpa`` run in bf16, plus rounding noise, measured as
each tensor's relative norm error.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from flashtile.integrations import transformers as integration  # noqa: E402

pytestmark = pytest.mark.gpu

VOCAB = 1024
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
FAMILIES = {
    "llama-gqa": (transformers.LlamaConfig, {}),
    "mistral-window": (transformers.MistralConfig, {"sliding_window": 128}),
}
# bf16 rounding noise of a relative norm error, added to both sides of the rule.
NOISE = 1e-3


def _models(family: str) -> dict[str, torch.nn.Module]:
    """The same random weights three ways: float32 sdpa (the truth), bf16 sdpa and bf16 flashtile."""
    config_class, extra = FAMILIES[family]
    truth = transformers.AutoModelForCausalLM.from_config(config_class(**COMMON, **extra)).cuda().eval()
    truth.set_attn_implementation("sdpa")
    low = copy.deepcopy(truth).to(torch.bfloat16)
    ours = copy.deepcopy(low)
    ours.set_attn_implementation(integration.register())
    return {"truth": truth, "sdpa": low, "flashtile": ours}


def _logits_and_grads(model: torch.nn.Module, weights: torch.Tensor, keep: torch.Tensor, **inputs: object):
    model.zero_grad()
    logits = model(**inputs, use_cache=False).logits.float()
    (logits * weights)[keep].sum().backward()
    return [logits[keep].detach()] + [p.grad.float() for p in model.parameters()]


def _relative(ours: torch.Tensor, truth: torch.Tensor) -> float:
    return float((ours.float() - truth).norm() / truth.norm())


def _check_rule(results: dict[str, list[torch.Tensor]]) -> None:
    for i, truth in enumerate(results["truth"]):
        factor = 2 if i == 0 else 3
        ours, baseline = _relative(results["flashtile"][i], truth), _relative(results["sdpa"][i], truth)
        what = "logits" if i == 0 else f"gradient {i - 1}"
        assert ours <= factor * baseline + NOISE, f"{what}: flashtile {ours:.3g}, sdpa bf16 {baseline:.3g}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_bf16_logits_and_gradients_within_twice_sdpas_error(family: str, padding: str, seed: int) -> None:
    models = _models(family)
    ids = torch.randint(0, VOCAB, (4, 1000), device="cuda")
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[0, :300], mask[2, :17] = 0, 0
    elif padding == "right":
        mask[0, 700:], mask[1, 129:] = 0, 0
    weights = torch.randn(*ids.shape, VOCAB, device="cuda")
    inputs = {"input_ids": ids, "attention_mask": None if padding == "none" else mask}
    _check_rule({n: _logits_and_grads(m, weights, mask.bool(), **inputs) for n, m in models.items()})


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_packed_batch_within_twice_sdpas_error_one_by_one(family: str, seed: int) -> None:
    models = _models(family)
    lengths = [700, 1, 1500, 333]
    sequences = [torch.randint(0, VOCAB, (1, n), device="cuda") for n in lengths]
    weights = [torch.randn(1, n, VOCAB, device="cuda") for n in lengths]
    results = {}
    for n, model in models.items():
        model.zero_grad()
        if n == "flashtile":
            position_ids = torch.cat([torch.arange(length, device="cuda") for length in lengths])[None]
            logits = model(torch.cat(sequences, 1), position_ids=position_ids, use_cache=False).logits.float()
            (logits * torch.cat(weights, 1)).sum().backward()
        else:
            alone = [model(s, use_cache=False).logits.float() for s in sequences]
            sum((a * w).sum() for a, w in zip(alone, weights, strict=True)).backward()
            logits = torch.cat(alone, 1)
        results[n] = [logits.detach()] + [p.grad.float() for p in model.parameters()]
    _check_rule(results)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_bf16_generate_picks_tokens_the_float32_model_ranks_first(family: str, cache: str, seed: int) -> None:
    # Random models have near-ties that bf16 may flip, so each greedy token must be the float32 model's best
    # within twice the bf16 sdpa model's logit error, rather than bitwise sdpa's.
    models = _models(family)
    ids = torch.randint(0, VOCAB, (3, 300), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :120] = 0
    tokens = models["flashtile"].generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=32, do_sample=False, cache_implementation=cache
    )
    full_mask = torch.cat([mask, torch.ones_like(tokens[:, ids.shape[1] :])], 1)
    with torch.no_grad():
        truth = models["truth"](tokens, attention_mask=full_mask).logits[:, ids.shape[1] - 1 : -1]
        low = models["sdpa"](tokens, attention_mask=full_mask).logits[:, ids.shape[1] - 1 : -1].float()
    slack = 2 * (low - truth).abs().amax() + 1e-3
    chosen = truth.gather(-1, tokens[:, ids.shape[1] :, None]).squeeze(-1)
    assert (chosen >= truth.amax(-1) - slack).all(), (truth.amax(-1) - chosen).amax()
