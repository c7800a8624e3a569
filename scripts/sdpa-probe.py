#!/usr/bin/env python3
"""PyTorch SDPA decode on kvc's main dense shape (B8, N 128K, Hq 32 / Hkv 8, d 128, f16), a few
launches, for Nsight Compute to profile (scripts/gpu-session20.sh prof)."""
import torch
import torch.nn.functional as F

B, HQ, HKV, N, D = 8, 32, 8, 131072, 128
q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.float16)
k = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.float16)
v = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.float16)
for _ in range(6):
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
