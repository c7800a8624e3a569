"""Shared helpers of the kvc Python tests: random data, a float64 attention reference, and the
markers that skip GPU tests without torch or a CUDA device."""

import os
import secrets

import numpy as np
import pytest

import kvc


def torch_cuda():
    """torch when it is importable and sees a CUDA device and kvc was built with CUDA, else
    None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or not kvc.cuda_enabled or kvc.cuda_device_count() == 0:
        return None
    return torch


requires_gpu = pytest.mark.skipif(torch_cuda() is None,
                                  reason="needs torch, a CUDA device and kvc built with CUDA")


@pytest.fixture
def rng():
    # A fresh seed per run (pytest prints it with a failing test's captured output); set
    # KVC_TEST_SEED to replay one.
    seed = int(os.environ.get("KVC_TEST_SEED", secrets.randbits(32)))
    print(f"KVC_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def randn(rng, shape, dtype=np.float16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def store_config(**kw):
    base = dict(num_kv_heads=2, head_dim=64, max_slots=3, max_context=160, recent_window=24,
                block_size=8, old_format="f16")
    base.update(kw)
    return kvc.KvStoreConfig(**base)


def attention_reference(q, keys, values, scale, positions=None, sink=None):
    """Softmax attention in float64. q [T, Hq, d]; keys/values [N, Hkv, d] (a sequence's tokens
    in position order); query t attends positions[t] (default: all N) — a list of index arrays.
    Returns out [T, Hq, d] and lse [T, Hq]."""
    T, Hq, d = q.shape
    Hkv = keys.shape[1]
    G = Hq // Hkv
    out = np.zeros((T, Hq, d))
    lse = np.zeros((T, Hq))
    for t in range(T):
        idx = np.arange(keys.shape[0]) if positions is None else np.asarray(positions[t])
        for h in range(Hq):
            k = keys[idx, h // G].astype(np.float64)
            v = values[idx, h // G].astype(np.float64)
            s = scale * (k @ q[t, h].astype(np.float64))
            m = s.max() if len(s) else 0.0
            if sink is not None:
                m = max(m, float(sink[h]))
            w = np.exp(s - m)
            den = w.sum() + (np.exp(float(sink[h]) - m) if sink is not None else 0.0)
            out[t, h] = (w @ v) / den
            lse[t, h] = m + np.log(den)
    return out, lse


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
