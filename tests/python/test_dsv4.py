"""kvc.dsv4 from Python: DeepSeek-V4's compressor, indexer, top-k and sparse attention against
the golden cases of tests/dsv4/golden (made by a re-implementation checked bit for bit against
DeepSeek's model.py; see their PROVENANCE.md), engine-owned pages, the bad-input errors, and
(with a GPU) CUDA against the CPU reference."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import kvc
from kvc import dsv4

from conftest import requires_gpu, torch_cuda

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "dsv4" / "golden"
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())
_DTYPES = {"f32": np.float32, "bf16": np.uint16, "i32": np.int32, "u8": np.uint8}


def golden(case, name):
    """A golden tensor as numpy (bf16 as its uint16 bits, which kvc reads as bf16)."""
    t = MANIFEST["cases"][case]["tensors"][name]
    return np.fromfile(GOLDEN / t["file"], dtype=_DTYPES[t["dtype"]]).reshape(t["shape"])


def to_device(device):
    """Array conversion for kvc objects on `device`: numpy unchanged on the CPU; torch tensors
    on CUDA (uint16 bf16 bits as bfloat16)."""
    if device == "cpu":
        return lambda a: a
    torch = torch_cuda()

    def to(a):
        t = torch.from_numpy(np.ascontiguousarray(a))
        return (t.view(torch.bfloat16) if t.dtype == torch.uint16 else t).cuda()
    return to


def host(a):
    """A numpy copy of an output array (a torch tensor comes back from its device)."""
    return a.cpu().numpy() if hasattr(a, "cpu") else a


def compress_golden(case, fmt, hadamard, splits, device="cpu", to=lambda a: a):
    """Runs a golden compressor case through kvc.dsv4 with each slot's tokens appended in the
    chunks of splits[slot]. Returns (compressor, store, the case's params)."""
    p = MANIFEST["cases"][case]["params"]
    ratio, dim, S = p["ratio"], p["head_dim"], p["S"]
    kv, score = golden(case, "kv_proj"), golden(case, "score_proj")
    comp = dsv4.Compressor(dsv4.CompressorConfig(ratio=ratio, head_dim=dim, max_slots=len(splits),
                                                 max_context=1024, max_tokens=S,
                                                 max_batch=len(splits), hadamard=hadamard),
                           device)
    store = dsv4.EntryStore(dsv4.EntryStoreConfig.compressed(fmt, dim, ratio, 1024, len(splits)),
                            device)
    tables = dict(norm_weight=to(golden(case, "norm_w")), rope_cos=to(golden(case, "cos")),
                  rope_sin=to(golden(case, "sin")))
    for slot, chunks in enumerate(splits):
        done = 0
        for T in chunks:
            comp.append([slot], to(np.ascontiguousarray(kv[None, done:done + T])),
                        to(np.ascontiguousarray(score[None, done:done + T])),
                        to(golden(case, "ape")), store=store, **tables)
            done += T
        assert done == S and comp.length(slot) == S
        assert store.count(slot) == S // ratio
    return comp, store, p


@pytest.mark.parametrize("case,fmt,hadamard", [
    ("compressor_r4_main", dsv4.EntryFormat.model1_fp8, False),
    ("compressor_r4_indexer", dsv4.EntryFormat.mxfp4, True),
    ("compressor_r128_main", dsv4.EntryFormat.model1_fp8, False),
])
def test_compressor_equals_golden_in_any_chunking(case, fmt, hadamard):
    S = MANIFEST["cases"][case]["params"]["S"]
    # One prefill; one token at a time; irregular chunks (chunked prefill).
    irregular = []
    for c in [3, 1, 7, 4, 13, 2, 129, 5, 64] + [11] * S:
        if sum(irregular) < S:
            irregular.append(min(c, S - sum(irregular)))
    comp, store, p = compress_golden(case, fmt, hadamard, [[S], [1] * S, irregular])
    n, dim = p["n_entries"], p["head_dim"]
    entries = kvc.from_bf16_bits(golden(case, "entries"))
    for slot in range(3):
        mine = np.stack([store.read_entry(slot, j) for j in range(n)])
        np.testing.assert_array_equal(mine, entries, err_msg=f"slot {slot}")
        kv, score = comp.state(slot)
        np.testing.assert_array_equal(kv, golden(case, "state_kv_after_prefill"))
        np.testing.assert_array_equal(score, golden(case, "state_score_after_prefill"))
    assert mine.shape == (n, dim)


def indexer_golden(device="cpu", to=lambda a: a):
    """The V4 decode golden case through the Indexer and select_topk: (scores, num_valid, ids)."""
    c = "indexer_v4_decode"
    H, D = 64, 128
    keys = dsv4.EntryStore(dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.mxfp4, D, 4, 256, 2),
                           device)
    k = kvc.from_bf16_bits(golden(c, "k_sim"))
    keys.append([1], to(k[None]))  # re-quantising FP4 values is exact
    # q_sim is already rotated and FP4: no Hadamard on kvc's side.
    idx = dsv4.Indexer(dsv4.IndexerConfig(max_query_tokens=1, query_hadamard=False), device)
    q = to(golden(c, "q_sim").reshape(1, 1, H, D))
    w = to(kvc.from_bf16_bits(golden(c, "w_scaled")).reshape(1, 1, H))
    scores, num_valid = idx.score(keys, [1], [164], q, w)  # start_pos 163
    sel = kvc.Selector(device)
    ids, counts = dsv4.select_topk(sel, scores, num_valid, 16)
    return scores, num_valid, ids, counts


def test_indexer_and_topk_equal_golden():
    c = "indexer_v4_decode"
    scores, num_valid, ids, counts = indexer_golden()
    gold = golden(c, "scores_f32")[0]
    n = gold.size
    assert num_valid.tolist() == [n] and scores.shape == (1, 64)
    np.testing.assert_allclose(scores[0, :n], gold, rtol=0, atol=1e-6 * np.abs(gold).max())
    assert counts.tolist() == [16]
    # The same top-16 set as DeepSeek's, up to entries whose scores tie at the cut.
    top = golden(c, "topk16_idx")[0]
    cut = np.sort(gold)[::-1][15]
    assert set(ids[0]) - set(top) <= set(np.flatnonzero(np.abs(gold - cut) <= 1e-6 * cut))
    assert (np.diff(scores[0, ids[0]]) <= 0).all()  # sorted, best first


def attention_golden(device="cpu", to=lambda a: a):
    """The HCA decode golden case (start_pos 299, ring 128 + 2 entries of ratio 128)."""
    c = "sparse_attn_r128_decode"
    d, H = 512, 4
    kv = golden(c, "kv_cache")  # rows [0, 128): the ring (token p in row p % 128); then entries
    ring = dsv4.EntryStore(dsv4.EntryStoreConfig.window_ring(dsv4.EntryFormat.bf16, d, 128, 1),
                           device)
    entries = dsv4.EntryStore(
        dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.bf16, d, 128, 1024, 1), device)
    entries.append([0], to(np.ascontiguousarray(kv[None, 128:130])))
    ring.append([0], to(np.ascontiguousarray(kv[np.arange(300) % 128][None])))
    attn = dsv4.SparseAttention(dsv4.SparseAttentionConfig(num_heads=H, ratio=128, hca=True),
                                device)
    q = to(golden(c, "q").reshape(1, 1, H, d))
    return attn.forward(ring, entries, [0], [300], q, sink=to(golden(c, "attn_sink")),
                        return_lse=True)


def test_hca_attention_equals_golden():
    out, lse = attention_golden()
    gold = golden("sparse_attn_r128_decode", "o_exact_f32").reshape(1, 1, 4, 512)
    assert out.dtype == np.float32 and lse.shape == (1, 1, 4) and np.isfinite(lse).all()
    assert np.linalg.norm(out - gold) / np.linalg.norm(gold) < 1e-5


def test_engine_pages_and_physical_entries(rng):
    cfg = dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.mxfp4, 64, 4, 1024, 2)
    cfg.page_entries = 16
    pages = 5
    pool = np.zeros(pages * cfg.page_bytes() + 7, dtype=np.uint8)  # a tail that is no page
    table = np.full((2, cfg.pages_per_slot()), -1, dtype=np.int32)
    table[1, :2] = [3, 0]  # the engine's choice of pages for slot 1
    store = dsv4.EntryStore.on_pages(cfg, "cpu", pool, table)
    assert store.engine_pages and store.free_pages() == 0
    x = rng.standard_normal((1, 20, 64)).astype(np.float32)
    store.append([1], x)
    assert store.count(1) == 20 and pool[3 * cfg.page_bytes():].any()
    ids = np.array([[0, 15, 16, 19, 20, -1]], dtype=np.int32)
    rows = store.physical_entries([1], 1, ids)
    assert rows.tolist() == [[3 * 16 + 0, 3 * 16 + 15, 0 * 16 + 0, 0 * 16 + 3, -1, -1]]
    # The same bits as a kvc-owned store holding the same entries.
    own = dsv4.EntryStore(cfg)
    own.append([1], x)
    for e in (0, 7, 19):
        np.testing.assert_array_equal(store.read_entry(1, e), own.read_entry(1, e))
    # A row past the engine's pages is refused, with nothing written.
    with pytest.raises(kvc.Error):
        store.append([1], rng.standard_normal((1, 20, 64)).astype(np.float32))
    assert store.count(1) == 20
    # Engine memory that cannot serve the config is refused when the store is made.
    with pytest.raises(kvc.Error, match="pool"):  # less than one page
        dsv4.EntryStore.on_pages(cfg, "cpu", np.zeros(cfg.page_bytes() - 1, np.uint8), table)
    with pytest.raises(kvc.Error, match="block_table"):  # a row per slot: 2, not 1
        dsv4.EntryStore.on_pages(cfg, "cpu", pool, table[:1].copy())
    with pytest.raises(kvc.Error, match="block_table"):  # fewer columns than pages_per_slot
        dsv4.EntryStore.on_pages(cfg, "cpu", pool, table[:, :1].copy())


def test_engine_model1_pages_read_as_flashmla_reads_them(tmp_path):
    """benchmarks/anchors/flashmla_kvc_pages.py --device cpu: kvc's attention over the MODEL1
    pages it wrote into engine pools (shuffled block tables, a partial last page) equals a float32
    reference that decodes the rows from the pool bytes alone at the pool rows physical_entries
    gives, which are what FlashMLA reads; on the GPU machine the script adds FlashMLA itself."""
    out = tmp_path / "pages.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/anchors/flashmla_kvc_pages.py"),
                          "--device", "cpu", "--batch", "2", "--entries", "300", "--topk", "128",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    checks = json.loads(out.read_text())["checks"]
    assert checks["ring_physical_entries_equal_hand_map"]
    assert checks["kvc_vs_reference_rel_l2"] < 1e-4 and checks["kvc_lse_max_abs_diff"] < 1e-3


def test_bad_input_raises_before_anything_changes(rng):
    with pytest.raises(kvc.Error, match="ratio"):
        dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.bf16, 512, 5, 1024, 1)
    with pytest.raises(kvc.Error, match="ratio"):
        dsv4.Compressor(dsv4.CompressorConfig(ratio=8, head_dim=64))
    store = dsv4.EntryStore(dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.bf16, 64, 128,
                                                             256, 1))
    store.append([0], np.ones((1, 2, 64), np.float32))
    with pytest.raises(kvc.Error):  # capacity: 256 / 128 = 2 entries
        store.append([0], np.ones((1, 1, 64), np.float32))
    assert store.count(0) == 2
    with pytest.raises(kvc.Error, match="x"):  # the wrong width
        store.append([0], np.ones((1, 1, 32), np.float32))
    keys = dsv4.EntryStore(dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.mxfp4, 128, 4, 256,
                                                            1))
    keys.append([0], rng.standard_normal((1, 8, 128)).astype(np.float32))
    idx = dsv4.Indexer(dsv4.IndexerConfig(max_query_tokens=1))
    q = kvc.to_bf16_bits(rng.standard_normal((1, 1, 64, 128)))
    w = np.ones((1, 1, 64), np.float32)
    scores = np.full((1, 64), -7.0, np.float32)
    with pytest.raises(kvc.Error, match="q"):  # H 32, not 64
        idx.score(keys, [0], [32], q[:, :, :32].copy(), w, scores=scores)
    with pytest.raises(kvc.Error):  # a length past what the store holds: 40 / 4 > 8 entries
        idx.score(keys, [0], [40], q, w, scores=scores)
    assert (scores == -7.0).all()
    scores, num_valid = idx.score(keys, [0], [32], q, w)
    with pytest.raises(kvc.Error, match="k"):  # k past the budget (ids' width)
        dsv4.select_topk(kvc.Selector(), scores, num_valid, 9, ids=np.empty((1, 8), np.int32))


def test_bf16_bits_round_to_nearest_even():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, np.inf], np.float32)
    assert kvc.to_bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80]
    assert np.isnan(kvc.from_bf16_bits(kvc.to_bf16_bits(np.float32(np.nan)))).all()


@requires_gpu
def test_cuda_equals_the_cpu_reference():
    to = to_device("cuda")
    S = MANIFEST["cases"]["compressor_r4_main"]["params"]["S"]
    _, cpu, p = compress_golden("compressor_r4_main", dsv4.EntryFormat.model1_fp8, False, [[S]])
    _, gpu, _ = compress_golden("compressor_r4_main", dsv4.EntryFormat.model1_fp8, False, [[S]],
                                "cuda", to)
    for j in range(p["n_entries"]):
        np.testing.assert_array_equal(gpu.read_entry(0, j), cpu.read_entry(0, j))
    s_cpu, n_cpu, ids_cpu, _ = indexer_golden()
    s_gpu, n_gpu, ids_gpu, _ = indexer_golden("cuda", to)
    n = int(n_cpu[0])
    assert n_gpu.cpu().tolist() == n_cpu.tolist()
    np.testing.assert_array_equal(s_gpu.cpu().numpy()[:, :n], s_cpu[:, :n])  # the same bits
    np.testing.assert_array_equal(ids_gpu.cpu().numpy(), ids_cpu)
    out_cpu, _ = attention_golden()
    out_gpu, lse_gpu = attention_golden("cuda", to)
    out_gpu = out_gpu.cpu().numpy()
    assert np.linalg.norm(out_gpu - out_cpu) / np.linalg.norm(out_cpu) < 1e-4


@requires_gpu
def test_cuda_engine_pages_and_physical_entries(rng):
    torch = torch_cuda()
    cfg = dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.model1_fp8, 512, 4, 1024, 2)
    cfg.page_entries = 16
    x = rng.standard_normal((1, 40, 512)).astype(np.float32)
    table = np.full((2, cfg.pages_per_slot()), -1, dtype=np.int32)
    table[1, :3] = [4, 1, 2]
    host = dsv4.EntryStore.on_pages(cfg, "cpu", np.zeros(6 * cfg.page_bytes(), np.uint8), table)
    pool = torch.zeros(6 * cfg.page_bytes(), dtype=torch.uint8, device="cuda")
    gpu = dsv4.EntryStore.on_pages(cfg, "cuda", pool, torch.from_numpy(table).cuda())
    host.append([1], x)
    gpu.append([1], torch.from_numpy(x).cuda())
    for e in (0, 17, 39):
        np.testing.assert_array_equal(gpu.read_entry(1, e), host.read_entry(1, e))
    ids = np.array([[0, 15, 16, 39, 40, -1], [31, 32, 1, 2, 3, 4]], dtype=np.int32)
    want = host.physical_entries([1, 1], 1, ids)
    got = gpu.physical_entries([1, 1], 1, torch.from_numpy(ids).cuda())
    assert got.is_cuda
    np.testing.assert_array_equal(got.cpu().numpy(), want)
    assert want[0].tolist() == [64, 64 + 15, 16, 32 + 7, -1, -1]


def sparse_attention_reference(ring, entries, slots, lengths, q, ids, chunk, sink, scale, W):
    """Float64 CSA attention from the stores' decoded rows (q, chunk: float arrays)."""
    batch, T, H, d = q.shape
    out, lse = np.zeros((batch, T, H, d)), np.zeros((batch, T, H))
    for b, slot in enumerate(slots):
        R = ring.count(slot)
        for t in range(T):
            p = lengths[b] - T + t
            rows = [ring.read_entry(slot, tok) if tok < R else chunk[b, tok - R]
                    for tok in range(max(0, p - W + 1), p + 1)]
            rows += [entries.read_entry(slot, e) for e in ids[b * T + t] if e >= 0]
            kv = np.asarray(rows, dtype=np.float64)
            logits = scale * kv @ q[b, t].T.astype(np.float64)  # [rows, H]
            m = np.maximum(logits.max(axis=0), sink)
            w = np.exp(logits - m)
            z = w.sum(axis=0) + np.exp(sink - m)
            out[b, t] = (w.T @ kv) / z[:, None]
            lse[b, t] = m + np.log(z)
    return out, lse


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_gpu)])
@pytest.mark.parametrize("T", [1, 3])
def test_csa_attention_matches_a_float64_reference(rng, T, device):
    to = to_device(device)
    H, d, W, ratio, k = 16, 128, 16, 4, 8
    slots, lengths = [1, 0], [70, 53]
    ring = dsv4.EntryStore(dsv4.EntryStoreConfig.window_ring(dsv4.EntryFormat.bf16, d, W, 2),
                           device)
    entries = dsv4.EntryStore(dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.bf16, d, ratio,
                                                               256, 2), device)
    # The ring holds every token before the queries' chunk (decode, T = 1: the query's token
    # too, so no chunk); the entries those tokens complete.
    chunk_len = T if T > 1 else 0
    for slot, L in zip(slots, lengths):
        before = L - chunk_len
        ring.append([slot], to(kvc.to_bf16_bits(rng.standard_normal((1, before, d)))))
        entries.append([slot], to(rng.standard_normal((1, L // ratio, d)).astype(np.float32)))
    chunk = kvc.to_bf16_bits(rng.standard_normal((2, chunk_len, d))) if chunk_len else None
    q = kvc.to_bf16_bits(rng.standard_normal((2, T, H, d)))
    ids = np.full((2 * T, k), -1, np.int32)
    for b, L in enumerate(lengths):
        for t in range(T):
            visible = (L - T + t + 1) // ratio
            pick = rng.choice(visible, size=min(k - 2, visible), replace=False)
            ids[b * T + t, :len(pick)] = pick  # the last two columns stay -1
    sink = rng.standard_normal(H).astype(np.float32)
    attn = dsv4.SparseAttention(dsv4.SparseAttentionConfig(
        num_heads=H, head_dim=d, ratio=ratio, window=W, max_batch=2, max_query_tokens=T,
        max_indices=k), device)
    out, lse = attn.forward(ring, entries, slots, lengths, to(q), indices=to(ids),
                            window_chunk=None if chunk is None else to(chunk), sink=to(sink),
                            return_lse=True)
    out, lse = host(out), host(lse)
    want, want_lse = sparse_attention_reference(
        ring, entries, slots, lengths, kvc.from_bf16_bits(q).reshape(q.shape), ids,
        kvc.from_bf16_bits(chunk).reshape(chunk.shape) if chunk is not None else None, sink,
        attn.config.scale(), W)
    # bf16 tensor cores on CUDA (kvc/dsv4/sparse_attention.h: the GPU tests bound it by 1e-4)
    assert np.linalg.norm(out - want) / np.linalg.norm(want) < (1e-5 if device == "cpu" else 1e-4)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-4)
    if device == "cpu":  # index values on the host are checked: one past what a query sees
        bad = ids.copy()
        bad[0, 0] = lengths[0] // ratio + 5
        out2 = np.full(out.shape, 7.0, np.float32)
        with pytest.raises(kvc.Error, match="indices"):
            attn.forward(ring, entries, slots, lengths, q, indices=bad, window_chunk=chunk,
                         sink=sink, out=out2)
        assert (out2 == 7.0).all()


def test_compressor_returns_the_entries_it_stores(rng):
    """return_entries gives each new entry after the epilogue (bf16 values, before the store's
    quantisation): a bf16 store holds exactly them; rows past a slot's new entries are not
    written."""
    ratio, dim, T = 4, 64, 10
    cfg = dsv4.CompressorConfig(ratio=ratio, head_dim=dim, max_slots=2, max_context=256,
                                max_tokens=T, max_batch=2)
    comp = dsv4.Compressor(cfg)
    store = dsv4.EntryStore(dsv4.EntryStoreConfig.compressed(dsv4.EntryFormat.bf16, dim, ratio,
                                                             256, 2))
    w = cfg.width()
    tables = dict(norm_weight=np.ones(dim, np.float32),
                  rope_cos=np.ones((64, 32), np.float32), rope_sin=np.zeros((64, 32), np.float32))
    ape = rng.standard_normal((ratio, w)).astype(np.float32)
    comp.append([1], rng.standard_normal((1, 3, w)).astype(np.float32),
                rng.standard_normal((1, 3, w)).astype(np.float32), ape, store=store, **tables)
    out = np.full((2, T // ratio + 1, dim), 9.0, np.float32)
    comp.append([0, 1], rng.standard_normal((2, T, w)).astype(np.float32),
                rng.standard_normal((2, T, w)).astype(np.float32), ape, store=store, out=out,
                **tables)
    assert [store.count(0), store.count(1)] == [2, 3]  # 10 // 4 and 13 // 4 entries
    for slot, new in [(0, [0, 1]), (1, [0, 1, 2])]:
        for k, e in enumerate(new):
            np.testing.assert_array_equal(out[slot, k], store.read_entry(slot, e))
    assert (out[0, 2] == 9.0).all()  # slot 0 completed two entries: its third row untouched
    again = comp.append([0], rng.standard_normal((1, 2, w)).astype(np.float32),
                        rng.standard_normal((1, 2, w)).astype(np.float32), ape,
                        return_entries=True, **tables)
    assert again.shape == (1, 1, dim) and comp.length(0) == 12


def test_fp8_indexer_prefill_equals_v32_golden():
    """DeepSeek-V3.2's fp8 indexer (one key per token, ratio 1) over 32 query tokens at once."""
    c = "indexer_v32_fp8"
    S, N, H, D = 32, 64, 64, 128  # the copied prefix: queries 0..31, all 64 keys
    keys = dsv4.EntryStore(dsv4.EntryStoreConfig(format=dsv4.EntryFormat.fp8_scaled, dim=D,
                                                 max_slots=1, max_entries=N))
    keys.append([0], kvc.from_bf16_bits(golden(c, "k_rotated"))[None])
    # V3.2's weights: bf16(w * 64^-1/2) * 128^-1/2 (the query's fp8 scale is kvc's).
    w_raw = kvc.from_bf16_bits(golden(c, "w_raw"))
    w = kvc.from_bf16_bits(kvc.to_bf16_bits(w_raw * np.float32(0.125))) * np.float32(128 ** -0.5)
    idx = dsv4.Indexer(dsv4.IndexerConfig(key_format=dsv4.EntryFormat.fp8_scaled, ratio=1,
                                          query_hadamard=False, max_query_tokens=S))
    q = golden(c, "q_rotated")[:S].reshape(1, S, H, D)
    scores, num_valid = idx.score(keys, [0], [S], q, w.reshape(1, S, H).astype(np.float32))
    gold = golden(c, "scores_f32")
    assert num_valid.tolist() == list(range(1, S + 1))  # causal: j <= t
    for t in range(S):
        g = gold[t, :t + 1]
        np.testing.assert_allclose(scores[t, :t + 1], g, rtol=0, atol=2e-6 * np.abs(g).max())
    ids, counts = dsv4.select_topk(kvc.Selector(), scores, num_valid, 16)
    top = golden(c, "topk16_idx")
    for t in range(S):  # the same set as DeepSeek's (-1 past the visible keys), up to ties
        mine, theirs = set(ids[t].tolist()), set(top[t].tolist())
        if mine != theirs:
            cut = np.sort(gold[t, :t + 1])[::-1][min(15, t)]
            tied = set(np.flatnonzero(np.abs(gold[t, :t + 1] - cut) <= 2e-6 * abs(cut)))
            assert mine - theirs <= tied, t
