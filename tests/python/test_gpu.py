"""The Python package on a CUDA device with torch tensors: attention against
torch.nn.functional.scaled_dot_product_attention, selection against torch.topk, and the CUDA
store bit-identical to the CPU one. Skipped without torch, a CUDA device or a CUDA build."""

import numpy as np
import pytest

import kvc
from conftest import requires_gpu, store_config, torch_cuda

pytestmark = requires_gpu
torch = torch_cuda()
HQ, HKV, D = 8, 2, 128


def config(fmt="f16", **kw):
    fields = dict(num_kv_heads=HKV, head_dim=D, max_slots=4, max_context=2048,
                  recent_window=128, block_size=32, old_format=fmt)
    fields.update(kw)
    return store_config(**fields)


def fill(store, lengths, gen, dtype=None):
    dtype = dtype or torch.float16
    ks, vs = [], []
    for n in lengths:
        slot = store.open_slot()
        k = torch.randn(n, HKV, D, generator=gen, device="cuda").to(dtype)
        v = torch.randn(n, HKV, D, generator=gen, device="cuda").to(dtype)
        store.ingest(slot, k, v)
        ks.append(k)
        vs.append(v)
    return ks, vs


def sdpa(q, k, v):
    """Reference of one decode row set: q [T, Hq, d], k/v [N, Hkv, d]; query t of T sits at
    N - T + t (causal), float32."""
    T, N = q.shape[0], k.shape[0]
    qq = q.float().permute(1, 0, 2)[None]
    kk = k.float().permute(1, 0, 2)[None]
    vv = v.float().permute(1, 0, 2)[None]
    mask = torch.ones(T, N, dtype=torch.bool, device=q.device).tril(N - T)
    out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask,
                                                           enable_gqa=True)
    return out[0].permute(1, 0, 2)


def rel(a, b):
    return (a.float() - b.float()).norm().item() / max(b.float().norm().item(), 1e-30)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("T", [1, 4])
def test_dense_mode_matches_sdpa(dtype, T):
    gen = torch.Generator(device="cuda").manual_seed(1234 + T)
    tdt = torch.float16 if dtype == "f16" else torch.bfloat16
    store = kvc.KvStore(config(fmt=dtype, dtype=dtype), "cuda")
    lengths = [1500, 300, 97]
    ks, vs = fill(store, lengths, gen, tdt)
    att = kvc.AttentionBackend(kvc.AttentionConfig(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                                                   dtype=dtype, mode="dense",
                                                   max_query_tokens=4), "cuda")
    q = torch.randn(3, T, HQ, D, generator=gen, device="cuda").to(tdt)
    out = att.decode(store, [0, 1, 2], q, out_dtype="f32")
    assert out.shape == (3, T, HQ, D) and out.dtype == torch.float32
    for b in range(3):
        assert rel(out[b], sdpa(q[b], ks[b], vs[b])) < 1e-3


def test_block_select_exact_with_every_block_is_dense():
    gen = torch.Generator(device="cuda").manual_seed(7)
    store = kvc.KvStore(config(), "cuda")
    ks, vs = fill(store, [1000], gen)
    q = torch.randn(1, 1, HQ, D, generator=gen, device="cuda").half()
    n = store.num_closed_blocks(0)
    index = kvc.BlockIndex(kvc.BlockIndexConfig(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D),
                           "cuda")
    scores, nv = index.score(store, [0], q)
    ids, counts = kvc.Selector("cuda").select(scores, nv, kvc.SelectPolicy.topk(n))
    assert counts.tolist() == [n] * HKV
    att = kvc.AttentionBackend(kvc.AttentionConfig(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D),
                               "cuda")
    out = att.decode(store, [0], q, ids, counts, out_dtype="f32")
    assert rel(out[0], sdpa(q[0], ks[0], vs[0])) < 1e-3


def test_selector_topk_matches_torch_topk():
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows, n, k = 64, 4096, 16
    scores = torch.randn(rows, n, generator=gen, device="cuda")
    num_valid = torch.full((rows,), n, dtype=torch.int32, device="cuda")
    ids, counts = kvc.Selector("cuda").select(scores, num_valid, kvc.SelectPolicy.topk(k))
    values, want = torch.topk(scores, k, dim=1)
    assert torch.equal(ids.long(), want)  # distinct random scores: no ties
    assert (counts == k).all()


def test_cuda_store_is_bit_identical_to_cpu():
    for fmt in ["q8", "fp16k_q4v"]:
        gen = torch.Generator(device="cuda").manual_seed(3)
        cpu = kvc.KvStore(config(fmt), "cpu")
        gpu = kvc.KvStore(config(fmt), "cuda")
        for n in [700, 65, 1]:
            k = torch.randn(n, HKV, D, generator=gen, device="cuda").half()
            v = torch.randn(n, HKV, D, generator=gen, device="cuda").half()
            slot = gpu.open_slot()
            assert cpu.open_slot() == slot
            gpu.ingest(slot, k, v)
            cpu.ingest(slot, k.cpu(), v.cpu())
        step = torch.randn(3, HKV, D, generator=gen, device="cuda").half()
        gpu.append([2, 0, 1], step, step)
        cpu.append([2, 0, 1], step.cpu(), step.cpu())
        assert gpu.snapshot() == cpu.snapshot(), fmt


def test_merge_on_cuda_matches_cpu():
    gen = torch.Generator(device="cuda").manual_seed(5)
    oa, ob = (torch.randn(33, 64, generator=gen, device="cuda") for _ in range(2))
    la, lb = (torch.randn(33, generator=gen, device="cuda") for _ in range(2))
    o, l = kvc.merge_states(oa, la, ob, lb)
    co, cl = kvc.merge_states(oa.cpu().numpy(), la.cpu().numpy(), ob.cpu().numpy(),
                              lb.cpu().numpy())
    np.testing.assert_array_equal(o.cpu().numpy(), co)
    np.testing.assert_array_equal(l.cpu().numpy(), cl)


def test_bad_input_on_cuda():
    store = kvc.KvStore(config(), "cuda")
    slot = store.open_slot()
    k = torch.zeros(1, HKV, D, dtype=torch.float16)
    with pytest.raises(kvc.Error, match="k.device = cpu"):
        store.append([slot], k, k)
    with pytest.raises(kvc.Error, match="k.dtype = f32"):
        store.append([slot], k.cuda().float(), k.cuda().float())
    assert store.length(slot) == 0


def test_stream_is_torchs_current_stream():
    gen = torch.Generator(device="cuda").manual_seed(9)
    side = torch.cuda.Stream()
    store = kvc.KvStore(config(), "cuda")
    with torch.cuda.stream(side):
        fill(store, [400], gen)
        assert store.impl.stream() == side.cuda_stream
    torch.cuda.synchronize()
    assert store.snapshot()[0].length == 400


def test_layered_cache_engine_pages_on_cuda_equal_cpu():
    gen = torch.Generator(device="cuda").manual_seed(21)
    layer = config("q8")
    cfgs = [kvc.LayeredCacheConfig(layer=layer, num_layers=2, pages="engine", max_rollback=4)
            for _ in range(2)]
    gpu, cpu = kvc.LayeredCache(cfgs[0], "cuda"), kvc.LayeredCache(cfgs[1], "cpu")
    tg, tc = gpu.block_table(), cpu.block_table()
    assert tg.is_cuda and tg.shape == tuple(tc.shape)
    pages = torch.randperm(layer.pool_blocks(), generator=torch.Generator().manual_seed(4))
    mb = layer.max_blocks_per_slot()
    rows = pages[: 2 * mb].view(2, mb).to(torch.int32)
    tg[:2] = rows.cuda()
    tc[:2] = rows.numpy()
    for cache in (gpu, cpu):
        cache.open_slot(), cache.open_slot()
    k = torch.randn(2, 600, HKV, D, generator=gen, device="cuda").half()
    gpu.ingest(0, k, k)
    cpu.ingest(0, k.cpu(), k.cpu())
    for step in range(5):
        s = torch.randn(2, 2, HKV, D, generator=gen, device="cuda").half()
        gpu.append([1, 0], s, s)
        cpu.append([1, 0], s.cpu(), s.cpu())
    gpu.truncate(0, 602)
    cpu.truncate(0, 602)
    for layer_index in range(2):
        assert gpu.layer(layer_index).snapshot() == cpu.layer(layer_index).snapshot()
    assert gpu.errors() == 0
