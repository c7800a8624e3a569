"""Scoring, selection, attention in every mode, merge and the planner through the Python
package (CPU, numpy), against float64 references written here, with the C++ argument checks."""

import numpy as np
import pytest

import kvc
from conftest import attention_reference, randn, rel_l2, store_config

HQ, HKV, D = 4, 2, 64


def filled_store(rng, lengths, **kw):
    cfg = store_config(**kw)
    s = kvc.KvStore(cfg)
    ks, vs = [], []
    for n in lengths:
        slot = s.open_slot()
        k, v = randn(rng, (n, HKV, D)), randn(rng, (n, HKV, D))
        s.ingest(slot, k, v)
        ks.append(k)
        vs.append(v)
    return s, ks, vs


def attention(mode, **kw):
    fields = dict(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, mode=mode)
    fields.update(kw)
    return kvc.AttentionBackend(kvc.AttentionConfig(**fields))


def test_mean_k_scores_match_numpy(rng):
    s, ks, _ = filled_store(rng, [70, 33])
    index = kvc.BlockIndex(kvc.BlockIndexConfig(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                                                max_batch=2))
    q = randn(rng, (2, 1, HQ, D))
    scores, num_valid = index.score(s, [0, 1], q)
    assert scores.shape == (4, s.config.max_blocks_per_slot())
    assert list(num_valid) == [(70 - 24) // 8] * 2 + [(33 - 24) // 8] * 2
    scale = 1 / np.sqrt(D)
    for b in range(2):
        for h in range(HKV):
            row = b * HKV + h
            for j in range(num_valid[row]):
                mean = ks[b][j * 8:(j + 1) * 8, h].astype(np.float32).mean(0)
                want = sum(scale * float(q[b, 0, g].astype(np.float32) @ mean)
                           for g in range(h * 2, h * 2 + 2))
                assert abs(scores[row, j] - want) <= 1e-4 * max(1.0, abs(want))


def test_token_mass_in_two_stages(rng):
    """kvc's default scorer (token mass over the mxfp4 index copy), one and two stages: the
    candidates are a mean-K index's top 5 and block 0 (select_row of an anchor policy), every
    other block scores -inf, and with every block a candidate the scores are one stage's."""
    s, _, _ = filled_store(rng, [300, 70], max_context=320,
                           summaries=kvc.SUMMARY_MEAN_K | kvc.SUMMARY_INDEX_KEYS)
    assert s.config.index_format == kvc.Format.mxfp4
    mb = s.config.max_blocks_per_slot()
    shape = dict(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, max_batch=2)
    mass = dict(score=kvc.SummaryScore.token_mass, token_keys=kvc.TokenKeys.index_copy,
                max_blocks_per_slot=mb, **shape)
    q = randn(rng, (2, 1, HQ, D))
    one, nv = kvc.BlockIndex(kvc.BlockIndexConfig(**mass)).score(s, [0, 1], q)
    first, _ = kvc.BlockIndex(kvc.BlockIndexConfig(**shape)).score(s, [0, 1], q)
    two, nv2 = kvc.BlockIndex(kvc.BlockIndexConfig(candidates=5, **mass)).score(s, [0, 1], q)
    assert list(nv2) == list(nv) == [34, 34, 5, 5]
    for r in range(4):
        n = nv[r]
        kept = set(kvc.select_row(first[r, :n].copy(), kvc.SelectPolicy.anchor(5, [0])))
        assert {j for j in range(n) if np.isfinite(two[r, j])} == kept
        assert all(two[r, j] == -np.inf for j in range(n) if j not in kept)
        assert 0 in kept and len(kept) <= 6
    every, _ = kvc.BlockIndex(kvc.BlockIndexConfig(candidates=kvc.MAX_CANDIDATES,
                                                   **mass)).score(s, [0, 1], q)
    for r in range(4):
        assert np.array_equal(every[r, :nv[r]], one[r, :nv[r]])
    expect_error(lambda: kvc.BlockIndexConfig(candidates=3, **shape).validate(),
                 "candidates = 3", "token_mass")


def test_selector_topk_matches_argsort_with_ties(rng):
    rows, n = 5, 37
    scores = rng.integers(-4, 4, size=(rows, n)).astype(np.float32)  # many ties
    num_valid = np.array([37, 0, 1, 20, 36], np.int32)
    ids, counts = kvc.Selector().select(scores, num_valid, kvc.SelectPolicy.topk(6))
    assert ids.shape == (rows, 6)
    for r in range(rows):
        nv = num_valid[r]
        want = sorted(range(nv), key=lambda j: (-scores[r, j], j))[:6]
        assert counts[r] == len(want)
        assert list(ids[r, :counts[r]]) == want
        assert (ids[r, counts[r]:] == -1).all()


POLICIES = [
    kvc.SelectPolicy.topk(4),
    kvc.SelectPolicy.neighbors(3, 1),
    kvc.SelectPolicy.threshold(0.5, 1, 9),
    kvc.SelectPolicy.anchor(3, [0, 5]),
    kvc.SelectPolicy.anchor_neighbors(2, 1),
    kvc.SelectPolicy.explicit_set(3, [1, 2], [4]),
    kvc.SelectPolicy.score_cluster(3, 0.3, 8),
    kvc.SelectPolicy.score_cluster_adaptive(2, 10, 0.2),
    kvc.SelectPolicy.top_p(0.8, 1, 12),
    kvc.SelectPolicy.topk(5).in_order(kvc.SelectPolicy.Order.chronological),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.kind.name)
def test_selector_equals_select_row(rng, policy):
    scores = randn(rng, (6, 29), np.float32)
    num_valid = np.array([29, 0, 3, 17, 29, 8], np.int32)
    ids, counts = kvc.Selector().select(scores, num_valid, policy)
    for r in range(6):
        want = kvc.select_row(scores[r, :num_valid[r]].copy(), policy)
        assert list(ids[r, :counts[r]]) == want


def positions(length, T, window=None):
    """Positions each of T query tokens sees in a slot of `length` tokens."""
    out = []
    for t in range(T):
        pos = length - T + t
        lo = 0 if window is None else max(0, pos - window + 1)
        out.append(np.arange(lo, pos + 1))
    return out


@pytest.mark.parametrize("T", [1, 3])
def test_dense_mode_matches_reference(rng, T):
    s, ks, vs = filled_store(rng, [90, 31, 5])
    q = randn(rng, (3, T, HQ, D))
    sink = randn(rng, (HQ,), np.float32)
    out, lse = attention("dense", max_query_tokens=4).decode(
        s, [0, 1, 2], q, sink=sink, return_lse=True, out_dtype="f32")
    for b, n in enumerate([90, 31, 5]):
        want, want_lse = attention_reference(q[b], ks[b], vs[b], 1 / np.sqrt(D),
                                             positions(n, T), sink)
        assert rel_l2(out[b], want) < 1e-5
        assert rel_l2(lse[b], want_lse) < 1e-6


def test_recent_modes_match_reference(rng):
    s, ks, vs = filled_store(rng, [90])
    q = randn(rng, (1, 1, HQ, D))
    for mode in ["dense_recent_only", "recent_only"]:
        out = attention(mode).decode(s, [0], q, out_dtype="f32")
        want, _ = attention_reference(q[0], ks[0], vs[0], 1 / np.sqrt(D), positions(90, 1, 24))
        assert rel_l2(out[0], want) < 1e-5, mode


def test_block_select_exact_attends_ring_open_and_selected(rng):
    s, ks, vs = filled_store(rng, [90])  # old 66: closed blocks 0..7, open block 8 (2 tokens)
    q = randn(rng, (1, 1, HQ, D))
    ids = np.full((HKV, 3), -1, np.int32)
    ids[0, :2] = [5, 1]
    ids[1, :3] = [0, 7, 2]
    counts = np.array([2, 3], np.int32)
    out = attention("block_select_exact").decode(s, [0], q, ids, counts, out_dtype="f32")
    for h in range(HKV):
        blocks = ids[h, :counts[h]]
        pos = np.concatenate([np.arange(b * 8, b * 8 + 8) for b in sorted(blocks)] +
                             [np.arange(64, 90)])
        for g in range(h * 2, h * 2 + 2):
            want, _ = attention_reference(q[0, :, g:g + 1], ks[0][:, h:h + 1], vs[0][:, h:h + 1],
                                          1 / np.sqrt(D), [pos])
            assert rel_l2(out[0, 0, g], want[0, 0]) < 1e-5


def test_every_mode_runs_and_lossy_modes_differ_from_dense(rng):
    s, _, _ = filled_store(rng, [100], summaries=kvc.SUMMARY_MEAN_K | kvc.SUMMARY_MEAN_V,
                           old_format="fp16k_q4v")
    q = randn(rng, (1, 1, HQ, D))
    scores, nv = kvc.BlockIndex(kvc.BlockIndexConfig(num_q_heads=HQ, num_kv_heads=HKV,
                                                     head_dim=D)).score(s, [0], q)
    ids, counts = kvc.Selector().select(scores, nv, kvc.SelectPolicy.topk(3))
    outs = {}
    for mode in kvc.AttentionMode:
        sel = (ids, counts) if kvc.uses_selection(mode) else (None, None)
        outs[mode.name] = attention(mode, num_representatives=2).decode(s, [0], q, *sel)
        assert np.isfinite(outs[mode.name].astype(np.float32)).all()
    assert not np.array_equal(outs["block_summary"], outs["dense"])


def test_dense_decode_matches_reference(rng):
    B, N = 2, 40
    k, v = randn(rng, (B, HKV, N, D)), randn(rng, (B, HKV, N, D))
    q = randn(rng, (B, 2, HQ, D))
    lengths = [40, 17]
    out = attention("dense", max_query_tokens=2).dense_decode(q, k, v, lengths, window=9,
                                                              out_dtype="f32")
    for b in range(B):
        want, _ = attention_reference(q[b], k[b].transpose(1, 0, 2)[:lengths[b]],
                                      v[b].transpose(1, 0, 2)[:lengths[b]], 1 / np.sqrt(D),
                                      positions(lengths[b], 2, 9))
        assert rel_l2(out[b], want) < 1e-5


def test_merge_of_halves_is_the_whole(rng):
    n, d = 7, 16
    s = rng.standard_normal((n, 30))
    v = rng.standard_normal((30, d))

    def state(cols):
        m = s[:, cols].max(1, keepdims=True)
        w = np.exp(s[:, cols] - m)
        return ((w @ v[cols]) / w.sum(1, keepdims=True)).astype(np.float32), \
            (m[:, 0] + np.log(w.sum(1))).astype(np.float32)

    oa, la = state(slice(0, 11))
    ob, lb = state(slice(11, 30))
    o, l = kvc.merge_states(oa, la, ob, lb)
    want_o, want_l = state(slice(0, 30))
    assert rel_l2(o, want_o) < 1e-5 and rel_l2(l, want_l) < 1e-6
    run_o, run_l = np.zeros((n, d), np.float32), np.full(n, -np.inf, np.float32)
    kvc.merge_states_inplace(run_o, run_l, oa, la)
    kvc.merge_states_inplace(run_o, run_l, ob, lb)
    assert rel_l2(run_o, want_o) < 1e-5


def test_planner(rng):
    spec = kvc.planner.with_block_select(kvc.planner.smollm2_135m(),
                                         kvc.planner.BlockSelectParams(recent_window=128))
    fp = kvc.planner.footprint(spec, 8192, 2)
    assert len(fp.layers) == spec.num_layers() == 30
    assert fp.total == sum(layer.bytes.total() for layer in fp.layers)
    cfg = kvc.planner.store_config(spec, kvc.planner.BlockSelectParams(recent_window=128), 8192, 2)
    assert fp.layers[0].bytes.total() == kvc.compute_footprint(cfg, []).total()
    assert fp.compression_ratio() > 1 and fp.fits(fp.total) and not fp.fits(fp.total - 1)
    assert "SmolLM2" in fp.table()


def expect_error(fn, *words):
    with pytest.raises(kvc.Error) as e:
        fn()
    for w in words:
        assert w in str(e.value), str(e.value)


def test_bad_compute_inputs(rng):
    s, _, _ = filled_store(rng, [60])
    q = randn(rng, (1, 1, HQ, D))
    index = kvc.BlockIndex(kvc.BlockIndexConfig(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D))
    rows, mb = 2, s.config.max_blocks_per_slot()
    expect_error(lambda: index.score(s, [0], q.astype(np.float32)), "q.dtype = f32")
    expect_error(lambda: index.score(s, [0], q, np.zeros((rows, mb), np.float64),
                                     np.zeros(rows, np.int32)), "scores.dtype")
    expect_error(lambda: index.score(s, [0], q, np.zeros((rows, mb), np.float32),
                                     np.zeros(rows + 1, np.int32)), "num_valid.shape")
    expect_error(lambda: index.score(s, [2], q), "2")
    scores, nv = index.score(s, [0], q)
    sel = kvc.Selector()
    expect_error(lambda: sel.select(scores, nv, kvc.SelectPolicy.topk(4),
                                    np.zeros((rows, 3), np.int32), np.zeros(rows, np.int32)),
                 "max_selected")
    expect_error(lambda: kvc.SelectPolicy.topk(-1), "k = -1")
    ids, counts = sel.select(scores, nv, kvc.SelectPolicy.topk(2))
    att = attention("block_select_exact")
    expect_error(lambda: att.decode(s, [0], q), "selection")
    expect_error(lambda: att.decode(s, [0], q, ids, None), "ids and counts")
    expect_error(lambda: att.decode(s, [0], q, ids, counts, sink=np.zeros(3, np.float32)),
                 "sink.shape")
    expect_error(lambda: att.decode(s, [0], q, ids, counts,
                                    out=np.zeros((1, 1, HQ, D + 1), np.float16)), "out.shape")
    bad = ids.copy()
    bad[0, 0] = 99
    expect_error(lambda: att.decode(s, [0], q, bad, counts), "99")
    expect_error(lambda: attention("dense", head_dim=65), "head_dim = 65")
