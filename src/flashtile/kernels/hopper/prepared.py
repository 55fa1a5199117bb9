"""Plain calls on the Hopper backend, prepared once per call signature.

flashtile.plain_calls remembers validation's verdict on a plain call (q, k, v plain 4-D tensors; causal, a
sliding window, softcap, contiguous ALiBi slopes and dropout at most) under a key of the tensors' shapes,
strides, dtypes and devices (the slopes' too), the options and the knobs the launches read. Everything
between that verdict and the kernels is then a function of the key: the backend's routing and support
checks, the launcher's configuration and prepared launch, the descriptors' shapes, strides and boxes, and
what Triton specialises on in the pointers. A :class:`PlainAttention` works them out at a key's first call;
that call and every later one allocate their outputs, wrap their tensors in descriptors and launch. A
learnable sink (its float32 tensor a call's, of the signature's shape) is folded in by the forward at every
head dim, and its gradient summed by the backward where the Gluon backward takes it (D = 64, not softcap or
deterministic).

What the key leaves open is checked at each call: TMA reads q, k and v only from 16-byte aligned addresses,
and a call whose tensors are not is handed back (None) to the general path, which routes it to the portable
kernels; the slopes' and dropout's random state's addresses pick the launch's pointer signature.
docs/design/host_path.md, "Prepared plain calls", has what this saves.
"""

from __future__ import annotations

import torch

from flashtile.kernels._block_sparse import NO_MODS
from flashtile.kernels._launch_cache import KernelLaunch
from flashtile.kernels.fwd import alibi_stride_b
from flashtile.kernels.hopper import bwd as gluon_bwd
from flashtile.kernels.hopper import bwd_window
from flashtile.kernels.hopper.descriptors import CheckedDescriptor, box_layout
from flashtile.kernels.hopper.fwd import WG_ROWS, launch_for, plain_call, plain_tiling, sparse_aux

__all__ = ["PlainAttention"]


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class _DescriptorFields:
    """A TMA descriptor's fields but its tensor (:func:`flashtile.kernels.hopper.descriptors.descriptor`'s
    shape, strides, box and layout), fixed by the call signature."""

    __slots__ = ("box", "layout", "shape", "strides")

    def __init__(
        self, shape: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...], dtype: torch.dtype
    ) -> None:
        self.shape, self.strides, self.box = list(shape), list(strides), list(box)
        self.layout = box_layout(dtype, tuple(box))

    def over(self, t: torch.Tensor) -> CheckedDescriptor:
        """The descriptor over ``t``, which has the signature's shape and strides."""
        return CheckedDescriptor(t, self.shape, self.strides, self.box, self.layout)


class PlainAttention:
    """The Hopper forward and backward of one plain call signature (module docstring): ``forward(q, k,
    v)`` gives ``(out, lse)`` and ``backward(dout, q, k, v, out, lse)`` gives ``(dq, dk, dv)`` as the
    backend's launchers do for these tensors, or None where the call must take the general path."""

    __slots__ = (
        "_aux", "_backward", "_device", "_dtype", "_fwd", "_k", "_lse_shape", "_o", "_out_shape", "_q",
        "_signatures", "_v",
    )  # fmt: skip

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        softmax_scale: float,
        causal: bool,
        window_size: tuple[int, int],
        softcap: float,
        deterministic: bool,
        alibi_slopes: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        learnable_sink: torch.Tensor | None = None,
    ) -> None:
        """For a call the Hopper forward runs (``kernels.hopper.prepare`` checks), softmax_scale > 0;
        ``alibi_slopes`` and ``learnable_sink`` stand for every call's (contiguous float32, of one shape)."""
        batch, seqlen_q, heads, head_dim = q.shape
        sink = learnable_sink is not None
        alibi = alibi_slopes is not None
        plain = plain_call(window_size, softcap, alibi, dropout_p, False, False, False, sink)
        cfg = plain_tiling(head_dim, plain, window_size, seqlen_q, k.shape[1])
        self._fwd = launch_for(
            q, k, batch, seqlen_q, k.shape[1], softmax_scale, causal, window_size, softcap, alibi_slopes,
            dropout_p, None, None, cfg, False, sink,
        )  # fmt: skip
        self._dtype, self._device = q.dtype, q.device
        self._out_shape, self._lse_shape = tuple(q.shape), (batch, heads, seqlen_q)
        rows_box, keys_box = (1, WG_ROWS.value, 1, head_dim), (1, cfg.BLOCK_N, 1, head_dim)
        self._q = _DescriptorFields(q.shape, q.stride(), rows_box, q.dtype)
        self._o = _DescriptorFields(q.shape, _contiguous_strides(q.shape), rows_box, q.dtype)
        self._k = _DescriptorFields(k.shape, k.stride(), keys_box, k.dtype)
        self._v = _DescriptorFields(v.shape, v.stride(), keys_box, v.dtype)
        self._aux = sparse_aux(NO_MODS, None)
        # Triton specialises a descriptor on its dtype and box, the LSE, the slopes and dropout's state on
        # their alignment, which the caching allocator's blocks always have (each call checks it all the
        # same): the signature of fresh blocks of their dtypes.
        lse = torch.empty((1,), dtype=torch.float32, device=q.device)
        slopes = None if alibi_slopes is None else torch.empty((1,), dtype=torch.float32, device=q.device)
        rng_state = None if not dropout_p else torch.empty((2,), dtype=torch.int64, device=q.device)
        sink_block = torch.empty((1,), dtype=torch.float32, device=q.device) if sink else None
        pointers = self._pointers(q, k, v, q, lse, slopes, rng_state, sink_block)
        self._signatures = self._fwd.pointer_signatures(pointers)
        self._backward = None
        window = bwd_window(causal, window_size)
        options = {
            "window_size": window, "deterministic": deterministic, "softcap": softcap,
            "alibi_slopes": alibi_slopes, "dropout_p": dropout_p, "learnable_sink": learnable_sink,
        }  # fmt: skip
        supported = gluon_bwd.bwd_unsupported_reason(q, k, v, q, options) is None
        if supported and gluon_bwd.routed_by_default(head_dim):
            self._backward = _GluonBackward(
                q, k, v, softmax_scale, window, deterministic, softcap, alibi_slopes, dropout_p, sink
            )

    def _pointers(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        slopes: torch.Tensor | None,
        rng_state: torch.Tensor | None,
        sink: torch.Tensor | None,
    ) -> tuple:
        """The forward kernel's pointer arguments (kernels/hopper/fwd.py's FWD_POINTERS) for a dense call
        without packed batch, block mask or float8 descales: the LSE stands in for each absent tensor."""
        return (
            self._q.over(q), self._k.over(k), self._v.over(v), self._o.over(out), lse,
            lse if slopes is None else slopes, lse, lse, lse, lse, lse, lse, lse, self._aux,
            lse if rng_state is None else rng_state, lse, lse if sink is None else sink,
        )  # fmt: skip

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        alibi_slopes: torch.Tensor | None = None,
        rng_state: torch.Tensor | None = None,
        learnable_sink: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(out, lse)`` of the call, or None where TMA cannot read q, k or v in place."""
        if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:
            return None
        # (validation hands the sink over in the LSE's dtype; the kernel reads σ_h at h.)
        sink = None if learnable_sink is None else learnable_sink.contiguous()
        out = torch.empty(self._out_shape, dtype=self._dtype, device=self._device)
        lse = torch.empty(self._lse_shape, dtype=torch.float32, device=self._device)
        aligned = lse.data_ptr()
        if alibi_slopes is not None:
            aligned |= alibi_slopes.data_ptr()
        if rng_state is not None:
            aligned |= rng_state.data_ptr()
        if sink is not None:
            aligned |= sink.data_ptr()
        signatures = self._signatures if aligned % 16 == 0 else None
        self._fwd.launch(self._pointers(q, k, v, out, lse, alibi_slopes, rng_state, sink), signatures)
        return out, lse

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        alibi_slopes: torch.Tensor | None = None,
        rng_state: torch.Tensor | None = None,
        learnable_sink: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...] | None:
        """``(dq, dk, dv)`` from the Gluon backward, and the sink's fp32 gradient fourth with a
        ``learnable_sink``, or None where the backend would run the portable one."""
        if self._backward is None:
            return None
        return self._backward(dout, q, k, v, out, lse, alibi_slopes, rng_state, learnable_sink)


class _GluonBackward:
    """The Gluon backward's three launches for one plain call signature (kernels/hopper/bwd.py's
    ``_launch`` for a dense call without block mask, at a head dim with a kernel of its own), for dO, out
    and the LSE laid out as the forward and a loss's gradient usually leave them: contiguous. A call with
    other strides or an unaligned address takes ``launch_supported``, which copies what TMA cannot read.
    With a learnable sink (``sink``) the fused kernel sums the sink's gradient, returned fourth."""

    __slots__ = (
        "_aux", "_device", "_direct", "_dk", "_dq", "_dq_target", "_dropout_p", "_dv", "_finish",
        "_finish_fields", "_fused", "_general", "_k", "_layouts", "_preprocess", "_q", "_signatures",
        "_stats", "_stats_rows", "_v", "deterministic",
    )  # fmt: skip

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        softmax_scale: float,
        window: tuple[int, int],
        deterministic: bool,
        softcap: float,
        alibi_slopes: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        sink: bool = False,
    ) -> None:
        batch, seqlen_q, heads, head_dim = q.shape
        seqlen_k, heads_kv = k.shape[1], k.shape[2]
        is_causal = window == (-1, 0)
        plain = gluon_bwd.is_plain_call(window, softcap, alibi_slopes, dropout_p)
        _, cfg = gluon_bwd.select_variant(head_dim, plain)
        q_strides, kv_strides = _contiguous_strides(q.shape), _contiguous_strides(k.shape)
        self._preprocess, self._fused, self._finish = gluon_bwd._bwd_launches(
            q.device, (batch, seqlen_q, heads, head_dim), (seqlen_k, heads_kv), softmax_scale, is_causal,
            deterministic, cfg, q_strides[:3], q_strides[:3], window, softcap, alibi_stride_b(alibi_slopes),
            None, False, None, dropout_p, sink,
            gluon_bwd.persistent_grid(head_dim, cfg, is_causal, plain, deterministic, sink),
            # A prepared call never has a block mask (block_mask False).
            gluon_bwd.dq_by_producer(deterministic, dropout_p > 0, False),
            gluon_bwd.dk_after_dq(head_dim, cfg, is_causal, plain, sink, deterministic),
        )  # fmt: skip
        self._general = (softmax_scale, window, deterministic, softcap)
        self._dropout_p = dropout_p
        self.deterministic = deterministic
        self._device = q.device
        # dO, out and the LSE as this launch reads them (contiguous), the LSE's (B, H, N_q) included.
        self._layouts = (q_strides, q_strides, _contiguous_strides((batch, heads, seqlen_q)))
        self._stats_rows = batch * heads * gluon_bwd._stats_rows(seqlen_q, cfg.block_m, None)
        bm, bn = cfg.block_m, cfg.block_n
        dq_rows, dq_cols = cfg.dq_box(head_dim)
        out_rows, out_cols = cfg.out_box(head_dim)
        # q's, and dO's (contiguous).
        self._q = (
            _rank3(q.shape, q.stride(), bm, head_dim, q.dtype),
            _rank3(q.shape, q_strides, bm, head_dim, q.dtype),
        )
        self._k = _rank3(k.shape, k.stride(), bn, head_dim, k.dtype)
        self._v = _rank3(v.shape, v.stride(), bn, head_dim, v.dtype)
        self._stats = _DescriptorFields((self._stats_rows,), (1,), (bm,), torch.float32)
        self._dk = _rank3(k.shape, kv_strides, out_rows, out_cols, k.dtype)
        self._dv = _rank3(v.shape, kv_strides, out_rows, out_cols, v.dtype)
        self._dq = _rank3(q.shape, q_strides, dq_rows, dq_cols, torch.float32)
        self._aux = sparse_aux(NO_MODS, None)
        # TMA reads q, k and v in place where their heads are packed and their strides 16-byte aligned
        # (kernels/hopper/bwd.py's _tma_ready, which otherwise copies them: the general launch does that).
        self._direct = all(gluon_bwd.heads_packed(t) for t in (q, k, v))
        # The deterministic dQ kernel writes dQ itself: the fused kernel's dQ descriptor is unused and any
        # fp32 tensor of its box serves (kernels/hopper/bwd.py's _launch allocates one a call).
        self._dq_target = None
        self._finish_fields = None
        if deterministic:
            self._dq_target = torch.empty((1, dq_rows, 1, dq_cols), dtype=torch.float32, device=q.device)
            target = self._dq_target
            self._dq = _rank3(target.shape, target.stride(), dq_rows, dq_cols, torch.float32)
            self._finish_fields = (
                _rank3(q.shape, q.stride(), gluon_bwd.DQ_BLOCK_M, head_dim, q.dtype),
                _rank3(k.shape, k.stride(), gluon_bwd.DQ_BLOCK_N, head_dim, k.dtype),
                _rank3(v.shape, v.stride(), gluon_bwd.DQ_BLOCK_N, head_dim, v.dtype),
                _rank3(q.shape, q_strides, gluon_bwd.DQ_BLOCK_M, head_dim, q.dtype),
                _rank3(q.shape, q_strides, gluon_bwd.DQ_BLOCK_M, head_dim, q.dtype),
            )
        self._signatures = None

    def __call__(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        alibi_slopes: torch.Tensor | None = None,
        rng_state: torch.Tensor | None = None,
        learnable_sink: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        laid_out = self._direct and (dout.stride(), out.stride(), lse.stride()) == self._layouts
        if not laid_out or (dout.data_ptr() | q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:
            rest = {"dropout_p": self._dropout_p, "rng_state": rng_state} if self._dropout_p else {}
            if learnable_sink is not None:
                rest["learnable_sink"] = learnable_sink
            return gluon_bwd.launch_supported(dout, q, k, v, out, lse, *self._general, alibi_slopes, rest)
        device = self._device
        lse2, delta = torch.empty((2, self._stats_rows), dtype=torch.float32, device=device).unbind(0)
        dk = torch.empty(k.shape, dtype=k.dtype, device=device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=device)
        dq = torch.empty(q.shape, dtype=q.dtype, device=device)
        sink = None if learnable_sink is None else learnable_sink.contiguous()
        # The sink's gradient, summed by atomic adds (kernels/hopper/bwd.py's _launch).
        dsink = None if sink is None else torch.zeros(sink.shape, dtype=torch.float32, device=device)
        if self.deterministic:
            dq_sum, dq_target = lse2, self._dq_target
        else:
            dq_sum = dq_target = torch.empty(q.shape, dtype=torch.float32, device=device)
        sink_ptrs = (lse2, lse2) if sink is None else (sink, dsink)
        pointers = (
            (out, dout, lse, lse2, delta, dq_sum, lse2, *sink_ptrs),
            (
                self._q[0].over(q), self._k.over(k), self._v.over(v), self._q[1].over(dout),
                self._stats.over(lse2), self._stats.over(delta), self._dq.over(dq_target), self._dk.over(dk),
                self._dv.over(dv), alibi_slopes, lse2, lse2, dk, dv, lse, lse, lse, lse, self._aux,
                lse2 if rng_state is None else rng_state, *sink_ptrs,
            ),
            self._finish_pointers(q, k, v, dout, dq, lse2, delta, dq_sum),
        )  # fmt: skip
        # Every tensor is 16-byte aligned (checked above, or a fresh block of the caching allocator, checked
        # here): the launches' pointer signatures are those of the first call.
        fresh = lse2.data_ptr() | delta.data_ptr() | dk.data_ptr() | dv.data_ptr() | dq.data_ptr()
        for option in (alibi_slopes, rng_state, sink, dsink):
            if option is not None:
                fresh |= option.data_ptr()
        aligned = (fresh | dq_sum.data_ptr() | out.data_ptr() | lse.data_ptr()) % 16 == 0
        signatures = self._signatures if aligned else None
        if signatures is None:
            signatures = tuple(map(KernelLaunch.pointer_signatures, pointers))
            if aligned:
                self._signatures = signatures
        for launch, p, signature in zip(self._launches(), pointers, signatures, strict=True):
            launch.launch(p, signature)
        return (dq, dk, dv) if dsink is None else (dq, dk, dv, dsink)

    def _launches(self) -> tuple:
        return self._preprocess, self._fused, self._finish

    def _finish_pointers(self, q, k, v, dout, dq, lse2, delta, dq_sum) -> tuple:
        """The dQ kernel's pointers (deterministic), or the postprocess's: the fp32 sum into dQ."""
        if not self.deterministic:
            return (dq_sum, dq, dq_sum)
        fq, fk, fv, fdo, fdq = self._finish_fields
        return (fq.over(q), fk.over(k), fv.over(v), fdo.over(dout), fdq.over(dq), lse2, delta)


def _rank3(
    shape: tuple[int, ...], strides: tuple[int, ...], rows: int, cols: int, dtype: torch.dtype
) -> _DescriptorFields:
    """kernels/hopper/bwd.py's rank-3 descriptor fields (:func:`~flashtile.kernels.hopper.bwd.rank3_fields`)
    for a (B, N, H, D) tensor of these strides."""
    return _DescriptorFields(*gluon_bwd.rank3_fields(shape, strides, rows, cols), dtype)
