"""etsdk-aoti's native attention kernel against SDPA: grouped heads, several query rows, padded masks, the rows it
reads, and refusals of tensors it cannot take."""

from __future__ import annotations

import pytest
import torch
from etsdk.backend import filled_rows
from etsdk_aoti import kernels


def _case(hq: int, h: int, rows: int, s: int, visible: list[int], seed: int = 0, e: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, rows, e, generator=g)
    k = torch.randn(1, h, s, e, generator=g)
    v = torch.randn(1, h, s, e, generator=g)
    mask = torch.zeros(1, 1, rows, s, dtype=torch.bool)
    for i, last in enumerate(visible):
        mask[0, 0, i, : last + 1] = True
    return q, k, v, mask


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize(("hq", "h", "visible"), [
    (4, 2, [0]),  # decode at position 0
    (9, 3, [37]),  # SmolLM2's grouping, decode at position 37
    (4, 4, [5, 6, 7, 7, 7]),  # a padded prefill chunk: padded rows see what the last real row sees
])
def test_the_kernel_computes_sdpa_and_reads_only_the_filled_rows(hq: int, h: int, visible: list[int]) -> None:
    q, k, v, mask = _case(hq, h, len(visible), 64, visible)
    k[:, :, max(visible) + 1 :] = float("nan")  # rows past the filled ones: reading them would poison the result
    v[:, :, max(visible) + 1 :] = float("nan")
    before = kernels.attention_rows_read()
    out = kernels.attention(q, k, v, mask, 0.25)
    assert kernels.attention_rows_read() - before == filled_rows(mask) == max(visible) + 1
    n = max(visible) + 1
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k[:, :, :n], v[:, :, :n], attn_mask=mask[..., :n], scale=0.25, enable_gqa=hq != h
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("e", [16, 64])  # any head size (one query row at a time), and 64 (blocks of query rows)
def test_repeated_query_rows_are_copied_not_computed(int8: bool, e: int) -> None:
    # a padded prefill chunk: rows 3.. are zeros under the last real row's mask; a row equal to the one before it
    # under another mask row (row 1 of head 0 below), or under an equal mask row but with other values, is computed
    from etsdk.backend import quantize_rows

    hq, h, visible = 6, 2, [4, 5, 6, 6, 6, 6, 6, 6]
    q, k, v, mask = _case(hq, h, len(visible), 64, visible, seed=3, e=e)
    q[:, :, 3:] = 0.0
    q[:, 0, 1] = q[:, 0, 0]  # same values, another mask row: computed
    q[:, 1, 4] = 1.0  # head 1: rows 4 and 5 differ from the row before them, so 6 of its 8 rows are computed
    q[:, 2, 5] = -0.0  # equal as numbers to the row before it (the rotary embedding gives zeros either sign)
    operands: tuple[torch.Tensor, ...] = (k, v)
    if int8:
        (kq, ks), (vq, vs) = quantize_rows(k), quantize_rows(v)
        k, v = kq.float() * ks, vq.float() * vs
        operands = (kq, vq, ks, vs)
    before = kernels.attention_queries_attended()
    out = kernels.attention(q, operands[0], operands[1], mask, 0.25, *operands[2:])
    assert kernels.attention_queries_attended() - before == hq * 4 + 2  # rows 0-3 of every head, head 1's rows 4-5
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[:, 0, 4:], out[:, 0, 3:4].expand(-1, 4, -1))  # copies of the run's computed row


@pytest.mark.usefixtures("kernel_level")
def test_a_ring_mask_with_gaps_is_honoured() -> None:
    q, k, v, mask = _case(2, 1, 1, 13, [0])
    mask[0, 0, 0] = torch.tensor([i in (0, 1, 2, 9, 10, 11, 12) for i in range(13)])  # wrapped ring slots
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5, enable_gqa=True)
    torch.testing.assert_close(kernels.attention(q, k, v, mask, 0.5), want, rtol=1e-5, atol=1e-5)


def test_tensors_the_kernel_cannot_take_are_refused() -> None:
    q, k, v, mask = _case(4, 2, 1, 8, [3])
    for bad in [
        (q.double(), k, v, mask),  # dtype
        (q, k, v, mask.float()),  # mask dtype
        (q, k[:, :, :4], v, mask),  # key rows differ from value rows
        (q[:, :3], k, v, mask),  # query heads not a multiple of key heads
        (q, torch.randn(1, 8, 2, 16).transpose(1, 2), v, mask),  # key [1, 2, 8, 16], not contiguous
    ]:
        with pytest.raises(ValueError, match="refused the tensors"):
            kernels.attention(*bad, 1.0)


def test_the_operator_refuses_operands_its_schema_does_not_take() -> None:
    from etsdk.backend import ATTENTION

    q, k, v, mask = _case(4, 2, 1, 8, [3])
    with pytest.raises(ValueError, match=r"etsdk::attention expects a bool mask, found torch.float32"):
        ATTENTION(q, k, v, mask.float(), 1.0)
    with pytest.raises(ValueError, match=r"query heads a multiple of key heads, found 3 and 2"):
        ATTENTION(q[:, :3], k, v, mask, 1.0)


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize(("hq", "h", "visible"), [(9, 3, [37]), (4, 4, [5, 6, 7, 7, 7])])
def test_the_int8_kernel_computes_the_operator_over_dequantized_rows(hq: int, h: int, visible: list[int]) -> None:
    from etsdk.backend import ATTENTION, dequantize_rows, quantize_rows

    q, k, v, mask = _case(hq, h, len(visible), 64, visible, seed=5)
    (kq, ks), (vq, vs) = quantize_rows(k), quantize_rows(v)
    n = max(visible) + 1
    ks[:, :, n:] = float("nan")  # scales past the filled rows: reading them would poison the result
    vs[:, :, n:] = float("nan")
    before = kernels.attention_rows_read()
    out = kernels.attention(q, kq, vq, mask, 0.25, ks, vs)
    assert kernels.attention_rows_read() - before == n
    want = torch.nn.functional.scaled_dot_product_attention(
        q, dequantize_rows(kq, ks)[:, :, :n], dequantize_rows(vq, vs)[:, :, :n], attn_mask=mask[..., :n], scale=0.25,
        enable_gqa=hq != h,
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ATTENTION(q, kq, vq, mask, 0.25, ks, vs), want, rtol=1e-5, atol=1e-5)
    # int8 rows stand close to the float ones: one scale per row keeps the error near 1/254 of each row's largest value
    exact = torch.nn.functional.scaled_dot_product_attention(
        q, k[:, :, :n], v[:, :, :n], attn_mask=mask[..., :n], scale=0.25, enable_gqa=hq != h
    )
    assert (out - exact).abs().max() < 0.05


def test_quantize_rows_is_symmetric_per_row_and_keeps_zero_rows() -> None:
    from etsdk.backend import dequantize_rows, quantize_rows

    rows = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5], [-127.0, 3.0, 127.0]])
    q, scale = quantize_rows(rows)
    assert q.dtype == torch.int8 and scale.shape == (3, 1)
    assert q[0].tolist() == [0, 0, 0] and scale[0].item() == 0.0  # no division by zero
    assert q[1].tolist() == [64, -127, 32] and q[2].tolist() == [-127, 3, 127]
    torch.testing.assert_close(dequantize_rows(q, scale), rows, atol=2.0 / 254, rtol=0)


def test_int8_operands_the_kernel_or_the_operator_cannot_take_are_refused() -> None:
    from etsdk.backend import ATTENTION, quantize_rows

    q, k, v, mask = _case(4, 2, 1, 8, [3])
    (kq, ks), (vq, vs) = quantize_rows(k), quantize_rows(v)
    for bad in [
        (q, kq, vq, mask, ks[:, :, :4], vs),  # scales for fewer rows
        (q, kq, vq, mask, ks.double(), vs),  # scale dtype
        (q, k, vq, mask, ks, vs),  # float key with scales
        (q, kq, vq, mask, ks, vs[..., 0]),  # a 3-D scale
    ]:
        with pytest.raises(ValueError, match="refused the tensors"):
            kernels.attention(bad[0], bad[1], bad[2], bad[3], 1.0, bad[4], bad[5])
    with pytest.raises(ValueError, match=r"key_scale float32 \[1, 2, 8, 1\], found torch.float32 \[1, 2, 4, 1\]"):
        ATTENTION(q, kq, vq, mask, 1.0, ks[:, :, :4], vs)
    with pytest.raises(ValueError, match=r"int8 key and value with scales, found torch.float32 and torch.int8"):
        ATTENTION(q, k, vq, mask, 1.0, ks, vs)
    with pytest.raises(ValueError, match=r"key_scale and value_scale with int8 key and value"):
        ATTENTION(q, kq, vq, mask, 1.0)
    with pytest.raises(ValueError, match=r"key_scale and value_scale both or neither"):
        ATTENTION(q, kq, vq, mask, 1.0, ks, None)


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("head_dim", [64, 128, 48])
@pytest.mark.parametrize("int8", [False, True])
def test_common_head_sizes_and_long_conversations_take_the_blocked_paths(head_dim: int, int8: bool) -> None:
    """Heads of 64 and 128 values run unrolled, sixteen rows per reduction, over chunks of 256 rows combined
    after; 48 runs the general loop. Rows 0 .. 600 in three chunks, a block of 16 and a tail in the last; a
    padded mask row; grouped heads."""
    from etsdk.backend import ATTENTION, quantize_rows

    g = torch.Generator().manual_seed(head_dim)
    q = torch.randn(1, 6, 3, head_dim, generator=g)
    k = torch.randn(1, 2, 700, head_dim, generator=g)
    v = torch.randn(1, 2, 700, head_dim, generator=g)
    mask = torch.zeros(1, 1, 3, 700, dtype=torch.bool)
    mask[0, 0, 0, :599] = True
    mask[0, 0, 1, 3:600] = True  # starts late: the first chunk's share of this row is partial
    mask[0, 0, 2, :601] = True
    scales: tuple[torch.Tensor, ...] = ()
    if int8:
        (k, ks), (v, vs) = quantize_rows(k), quantize_rows(v)
        scales = (ks, vs)
    out = kernels.attention(q, k, v, mask, 0.2, *scales)
    torch.testing.assert_close(out, ATTENTION(q, k, v, mask, 0.2, *scales), rtol=2e-5, atol=2e-5)


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("int8", [False, True])
def test_a_prefill_shaped_call_takes_its_query_rows_in_batches(head_dim: int, int8: bool) -> None:
    """A prefill chunk: 41 query rows per head, 3 heads per key / value head (123 query rows reading each key /
    value row: batches of 16, the last partial, outputs summed 4 or 2 at a time with a remainder), under a causal
    mask that leaves the early rows seeing nothing of the last chunk of 256 rows, over two batch entries with
    masks of their own."""
    from etsdk.backend import ATTENTION, quantize_rows

    g = torch.Generator().manual_seed(head_dim + int8)
    q = torch.randn(2, 6, 41, head_dim, generator=g)
    k = torch.randn(2, 2, 640, head_dim, generator=g)
    v = torch.randn(2, 2, 640, head_dim, generator=g)
    mask = torch.zeros(2, 1, 41, 640, dtype=torch.bool)
    for row in range(41):
        mask[0, 0, row, : 400 + 5 * row] = True  # rows before 23 see nothing of rows 512 ..
        mask[1, 0, row, 3 * row : 200 + 10 * row] = True
    scales: tuple[torch.Tensor, ...] = ()
    if int8:
        (k, ks), (v, vs) = quantize_rows(k), quantize_rows(v)
        scales = (ks, vs)
    out = kernels.attention(q, k, v, mask, 0.2, *scales)
    torch.testing.assert_close(out, ATTENTION(q, k, v, mask, 0.2, *scales), rtol=2e-5, atol=2e-5)


def _sessions(lengths: list[int], int8: bool, seed: int = 7) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """A batched decode step's operands: one query row per session [B, 9, 1, 64], each session's own caches
    [1, 3, 600, 64] (int8 with row scales: the scales' lists last) filled to its length, NaN past it, and each
    session's mask row."""
    from etsdk.backend import quantize_rows

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(len(lengths), 9, 1, 64, generator=g)
    mask = torch.zeros(len(lengths), 1, 1, 600, dtype=torch.bool)
    keys, values, scales = [], [], []
    for b, n in enumerate(lengths):
        mask[b, 0, 0, :n] = True
        k, v = torch.randn(1, 3, 600, 64, generator=g), torch.randn(1, 3, 600, 64, generator=g)
        if int8:
            (k, ks), (v, vs) = quantize_rows(k), quantize_rows(v)
            ks[:, :, n:], vs[:, :, n:] = float("nan"), float("nan")  # read past its length: the result is poisoned
            scales += [ks, vs]
        else:
            k[:, :, n:], v[:, :, n:] = float("nan"), float("nan")
        keys.append(k)
        values.append(v)
    return q, keys, values, mask, scales


@pytest.mark.usefixtures("kernel_level")
@pytest.mark.parametrize("int8", [False, True])
def test_the_slots_form_attends_each_session_over_its_own_rows(int8: bool) -> None:
    # sessions of different lengths in one call (the longest spans two of the kernel's chunks of 256 rows): each
    # reads its own filled rows only, and equals its own call of the kernel
    from etsdk.backend import dequantize_rows

    lengths = [5, 300, 1, 520]
    q, keys, values, mask, scales = _sessions(lengths, int8)
    key_scales, value_scales = scales[0::2], scales[1::2]
    before = kernels.attention_rows_read()
    out = kernels.attention_slots(q, keys, values, mask, 0.125, key_scales, value_scales)
    assert kernels.attention_rows_read() - before == sum(lengths)
    for b, n in enumerate(lengths):
        k, v = (dequantize_rows(keys[b], key_scales[b]), dequantize_rows(values[b], value_scales[b])) if int8 else (keys[b], values[b])
        want = torch.nn.functional.scaled_dot_product_attention(
            q[b : b + 1], k[:, :, :n], v[:, :, :n], scale=0.125, enable_gqa=True
        )
        torch.testing.assert_close(out[b : b + 1], want, rtol=1e-5, atol=1e-5)
        alone = kernels.attention(q[b : b + 1], keys[b], values[b], mask[b : b + 1], 0.125, *scales[2 * b : 2 * b + 2])
        assert torch.equal(out[b : b + 1], alone)
    # one mask row for every session: each reads the rows that row sees
    shared = mask[1:2]
    out = kernels.attention_slots(q[:2], keys[1:3], values[1:3], shared, 0.125, key_scales[1:3], value_scales[1:3])
    for b in range(2):
        alone = kernels.attention(q[b : b + 1], keys[1 + b], values[1 + b], shared, 0.125, *scales[2 * (1 + b) : 2 * (1 + b) + 2])
        assert torch.equal(out[b : b + 1], alone)


def test_slots_the_kernel_cannot_take_are_refused() -> None:
    q, keys, values, mask, _ = _sessions([3, 4, 5], int8=False)
    _, keys8, values8, _, scales = _sessions([3, 4, 5], int8=True)
    odd = [keys[0], torch.randn(1, 3, 500, 64), keys[2]]  # one session's cache of another size
    for bad in [
        (q, keys[:2], values[:2], mask),  # fewer sessions than query rows
        (q, keys, values[:2], mask),  # keys and values of different sessions
        (q, odd, values, mask),
        (q, [torch.randn(2, 3, 600, 64)] * 3, [torch.randn(2, 3, 600, 64)] * 3, mask),  # a session's cache of batch 2
        (q, keys, values, mask[:2]),  # two mask rows for three sessions
        (q, keys8, values8, mask, scales[0::2][:2], scales[1::2][:2]),  # scales for two sessions of three
        (q, keys8, values8, mask),  # int8 rows without their scales
        (q, keys, values, mask, scales[0::2], scales[1::2]),  # float rows with int8 scales
    ]:
        with pytest.raises(ValueError, match="refused the tensors"):
            kernels.attention_slots(*bad[:4], 0.125, *bad[4:])


class _PerSession(torch.nn.Module):
    """What a batched decode step's attention computes: row b of the query over session b's caches, concatenated
    (etsdk-hf-static's BatchedDecodeLM makes such calls)."""

    def __init__(self, shared_mask: bool = False, order: tuple[int, ...] = (0, 1, 2)) -> None:
        super().__init__()
        self.shared_mask, self.order = shared_mask, order

    def forward(self, q: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        from etsdk.backend import ATTENTION

        caches = (k0, k1, k2)
        rows = [mask if self.shared_mask else mask[b : b + 1] for b in range(3)]
        return torch.cat([ATTENTION(q[b : b + 1], caches[s], caches[s] * 2, rows[b], 0.125) for b, s in enumerate(self.order)])


@pytest.mark.parametrize(("module", "merged"), [
    (_PerSession(), 1),
    (_PerSession(shared_mask=True), 1),
    (_PerSession(order=(0, 2, 1)), 1),  # any cache per row: the calls name each row's own
])
def test_a_batched_steps_per_session_calls_become_one_kernel_call(module: torch.nn.Module, merged: int) -> None:
    from etsdk.backend import calls_attention
    from etsdk_aoti.attention import kernel_attention_slots, rewrite_attention

    q, keys, _, mask, _ = _sessions([4, 9, 2], int8=False)
    keys = [k.nan_to_num(0.0) for k in keys]
    operands = (q, *keys, mask[:1] if getattr(module, "shared_mask", False) else mask)
    want = module(*operands)
    graph_module = torch.export.export(module, operands).module()
    assert rewrite_attention(graph_module, "cpu")
    nodes = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    assert sum(n.target is kernel_attention_slots for n in nodes) == merged
    assert not any(calls_attention(n) for n in nodes)
    torch.testing.assert_close(graph_module(*operands), want, rtol=1e-5, atol=1e-5)


def test_calls_that_are_not_one_per_session_row_stay_apart() -> None:
    from etsdk_aoti.attention import fuse_slot_attention

    class Rows(torch.nn.Module):  # row 1's query attended twice, row 2's never: not one call per session row
        def forward(self, q: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            from etsdk.backend import ATTENTION

            return torch.cat([ATTENTION(q[b : b + 1], k, k, mask[b : b + 1], 0.125) for b, k in zip((0, 1, 1), (k0, k1, k2))])

    q, keys, _, mask, _ = _sessions([4, 9, 2], int8=False)
    graph_module = torch.export.export(Rows(), (q, *[k.nan_to_num(0.0) for k in keys], mask)).module()
    assert fuse_slot_attention(graph_module.graph) == 0
