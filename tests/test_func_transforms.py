"""torch.func over attention: vmap (samples folded into heads), per-sample gradients (vmap over grad) and
jacrev, against the same calls made sample by sample, on every backend of the device."""

from __future__ import annotations

import pytest
import torch

from flashtile import FlashAttention, flash_attn_func, flash_attn_varlen_func
from flashtile.reference import naive

# (device, FLASHTILE_BACKEND, dtype): the reference and the portable kernels in Triton's interpreter on the
# CPU (fp32: the interpreter's bf16 dots are broken), the default backend on a GPU.
BACKENDS = [
    ("cpu", "reference", torch.float32),
    ("cpu", "triton", torch.float32),
    pytest.param(("cuda", "auto", torch.float16), marks=pytest.mark.gpu),
]


@pytest.fixture(params=BACKENDS, ids=lambda p: f"{p[0]}-{p[1]}")
def setup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, torch.dtype]:
    device, backend, dtype = request.param
    monkeypatch.setenv("FLASHTILE_BACKEND", backend)
    return device, dtype


def _randn(*shape: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype)


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    # The folded call and the per-sample calls run the same arithmetic a head at a time; fp16 on the GPU
    # may tile the folded call differently, so allow its rounding.
    tol = 0 if got.dtype == torch.float32 and got.device.type == "cpu" else 2e-3
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def test_vmap_equals_a_loop_over_samples(setup: tuple[str, torch.dtype], seed: int) -> None:
    # GQA (4 query heads on 2 KV heads), odd lengths, N_q != N_k, causal, softcap, ALiBi with (B, H) slopes
    # mapped per sample, and a sink shared by the samples; the mapped dimension not in front for k.
    device, dtype = setup
    samples, batch, seqlen_q, seqlen_k, heads, heads_kv, dim = 3, 2, 7, 11, 4, 2, 16
    q = _randn(samples, batch, seqlen_q, heads, dim, device=device, dtype=dtype)
    k = _randn(batch, seqlen_k, samples, heads_kv, dim, device=device, dtype=dtype)
    v = _randn(samples, batch, seqlen_k, heads_kv, dim, device=device, dtype=dtype)
    slopes = torch.rand(samples, batch, heads, device=device)
    sink = torch.randn(heads, device=device)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
        return flash_attn_func(q, k, v, causal=True, softcap=3.0, alibi_slopes=slopes, learnable_sink=sink)

    got = torch.vmap(attend, in_dims=(0, 2, 0, 0))(q, k, v, slopes)
    assert got.shape == (samples, batch, seqlen_q, heads, dim)
    for s in range(samples):
        _close(got[s], attend(q[s], k[:, :, s], v[s], slopes[s]))


def test_vmap_of_unbatched_kv_and_lse(setup: tuple[str, torch.dtype], seed: int) -> None:
    # k, v and 1-D slopes shared by every sample (in_dims None); the LSE comes back mapped as well.
    device, dtype = setup
    q = _randn(2, 1, 5, 2, 8, device=device, dtype=dtype)
    k, v = (_randn(1, 9, 2, 8, device=device, dtype=dtype) for _ in range(2))
    slopes = torch.rand(2, device=device)

    def attend(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse, _ = flash_attn_func(
            q, k, v, alibi_slopes=slopes, window_size=(3, 1), return_attn_probs=True
        )
        return out, lse

    out, lse = torch.vmap(attend)(q)
    for s in range(2):
        expected_out, expected_lse = attend(q[s])
        _close(out[s], expected_out)
        _close(lse[s], expected_lse)


def test_vmap_of_a_packed_batch(setup: tuple[str, torch.dtype], seed: int) -> None:
    device, dtype = setup
    cu_seqlens = torch.tensor([0, 3, 3, 10], dtype=torch.int32, device=device)
    q, k, v = (_randn(2, 10, 2, 8, device=device, dtype=dtype) for _ in range(3))

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, 7, 7, causal=True)

    got = torch.vmap(attend)(q, k, v)
    for s in range(2):
        _close(got[s], attend(q[s], k[s], v[s]))


def test_per_sample_gradients_and_jacrev(setup: tuple[str, torch.dtype], seed: int) -> None:
    # vmap over grad (per-sample gradients, as differential privacy takes them) and jacrev (vmap over the
    # backward's vector-Jacobian products), against autograd sample by sample and the float64 oracle.
    device, dtype = setup
    q = _randn(3, 1, 6, 2, 8, device=device, dtype=dtype)
    k, v = (_randn(3, 1, 9, 1, 8, device=device, dtype=dtype) for _ in range(2))
    sink = torch.randn(2, device=device)

    def loss(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
        return flash_attn_func(q, k, v, causal=True, softcap=2.0, learnable_sink=sink).float().square().sum()

    grads = torch.vmap(torch.func.grad(loss, argnums=(0, 1, 2, 3)), in_dims=(0, 0, 0, None))(q, k, v, sink)
    for s in range(3):
        leaves = [t.detach().clone().requires_grad_() for t in (q[s], k[s], v[s], sink)]
        expected = torch.autograd.grad(loss(*leaves), leaves)
        for got, want in zip(grads, expected, strict=True):
            _close(got[s], want)
    if dtype != torch.float32:
        return
    # jacrev of one sample's output with respect to q, against the float64 oracle's.
    q1, k1, v1 = (t[0].double() for t in (q, k, v))
    jac = torch.func.jacrev(lambda q: flash_attn_func(q.float(), k1.float(), v1.float(), causal=True))(
        q1.float()
    )
    oracle = torch.func.jacrev(lambda q: naive.attention(q, k1, v1, causal=True)[0])(q1)
    torch.testing.assert_close(jac.double(), oracle, rtol=1e-4, atol=1e-5)


def test_vmap_refusals(setup: tuple[str, torch.dtype]) -> None:
    device, dtype = setup
    q, k, v = (_randn(2, 1, 4, 2, 8, device=device, dtype=dtype) for _ in range(3))

    def dropped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attn_func(q, k, v, dropout_p=0.5)

    with pytest.raises(RuntimeError, match="randomness error mode"):
        torch.vmap(dropped)(q, k, v)
    with pytest.raises(RuntimeError, match=r"randomness='different'.*got randomness='same'"):
        torch.vmap(dropped, randomness="same")(q, k, v)
    # Each sample draws its own mask: identical samples come back different.
    same = q[:1].expand(2, *q.shape[1:])
    out = torch.vmap(dropped, randomness="different")(same, same, same)
    assert not torch.equal(out[0], out[1])
    cu_seqlens = torch.tensor([[0, 4], [0, 4]], dtype=torch.int32, device=device)
    with pytest.raises(NotImplementedError, match="vmap over cu_seqlens_q is not supported"):
        torch.vmap(lambda q, cu: flash_attn_varlen_func(q, q, q, cu, cu, 4, 4))(q[:, 0], cu_seqlens)


def test_per_sample_gradients_of_the_layer(setup: tuple[str, torch.dtype], seed: int) -> None:
    # The parameters' per-sample gradients of FlashAttention (GQA, causal), against autograd sample by sample.
    device, dtype = setup
    layer = FlashAttention(32, num_heads=4, num_kv_heads=2, causal=True).to(device=device, dtype=dtype)
    x = _randn(3, 1, 5, 32, device=device, dtype=dtype)
    params = {name: p.detach() for name, p in layer.named_parameters()}

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layer, params, (x,)).float().square().sum()

    grads = torch.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    for s in range(3):
        layer.zero_grad()
        loss(dict(layer.named_parameters()), x[s]).backward()
        for name, param in layer.named_parameters():
            # The projections' batched matmuls round differently from one sample's.
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(grads[name][s], param.grad, rtol=tol, atol=tol)
