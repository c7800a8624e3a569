#!/usr/bin/env python3
"""Writes docs/perf-data/latest.json from ONE GPU run's raw JSON (issue #12 item 8): one object
per row, {"name", "kvc_us", "anchor", "anchor_us", "floor_us", "note"}, every figure from that
run. A row whose kvc benchmark or anchor is not in the run gets null there and a note saying so,
never a figure from another run.

  scripts/perf-latest.py RUN_DIR --date D --command C [--out docs/perf-data/latest.json]

floor_us is the row's bytes at 4.6 TB/s: from the benchmark's own counters (floor_us, or
bytes / MB_read, or bytes_per_second x time), else the fixed byte count given below.
"""
import argparse
import importlib.util
import json
import os

# perf-report.py's loaders (its file name is not an importable module name).
_spec = importlib.util.spec_from_file_location(
    "perf_report", os.path.join(os.path.dirname(os.path.abspath(__file__)), "perf-report.py"))
perf_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(perf_report)

HBM_TBPS = 4.6

# name, kvc benchmark prefix, anchor row, anchor field, fixed bytes (None: the counters), note.
ROWS = [
    ("step_B1_N128K", "BM_DecodeStep/1/131072/0/1/0/", "torch_block_select_B1_N128K", "graph_us",
     None, "the issue's shape: token mass over the mxfp4 index copy, top 8 x 32 + ring 1024, "
     "fp16k_q4v (the library's default until 2026-12-02); anchor: the PyTorch block-select step "
     "(graph replay)"),
    ("step_B8_N128K", "BM_DecodeStep/8/131072/0/1/0/", "torch_block_select_B8_N128K", "graph_us",
     None, "as step_B1_N128K"),
    ("step_default_B1_N128K", "BM_DecodeStep/1/131072/0/1/1/", "torch_block_select_B1_N128K",
     "graph_us", None, "default_block_select() since 2026-12-02: the same scorer over ring 256 + "
     "top 32 x 32 (the same 1280 attended tokens)"),
    ("step_default_B8_N128K", "BM_DecodeStep/8/131072/0/1/1/", "torch_block_select_B8_N128K",
     "graph_us", None, "as step_default_B1_N128K"),
    ("step_meank_B1_N128K", "BM_DecodeStep/1/131072/0/0/0/", "torch_block_select_B1_N128K",
     "graph_us", None, "mean-K f32 summaries (the PyTorch step scores by mean K too)"),
    ("step_meank_B8_N128K", "BM_DecodeStep/8/131072/0/0/0/", "torch_block_select_B8_N128K",
     "graph_us", None, "as step_meank_B1_N128K"),
    ("step_B8_N128K_vs_sdpa", "BM_DecodeStep/8/131072/0/1/0/", "sdpa_decode_B8_N128K", "us",
     None, "the default step against SDPA dense decode"),
    ("step_B32_N32K", "BM_DecodeStep/32/32768/0/1/0/", None, None, None,
     "the default step; no anchor at this shape in the run"),
    ("step_two_stage_B1_N128K", "BM_DecodeStep/1/131072/0/3/1/", "torch_block_select_B1_N128K",
     "graph_us", None, "two-stage token mass (BlockIndexConfig::candidates = 128, f16 mean K "
     "first) over ring 256 + top 32 x 32: the step's byte-floor route for the default scorer"),
    ("step_two_stage_B8_N128K", "BM_DecodeStep/8/131072/0/3/1/", "torch_block_select_B8_N128K",
     "graph_us", None, "as step_two_stage_B1_N128K"),
    ("step_two_stage_B32_N32K", "BM_DecodeStep/32/32768/0/3/1/", None, None, None,
     "as step_two_stage_B1_N128K; no anchor at this shape in the run"),
    ("dense_B1_N128K", "BM_DenseDecode/0/1/131072/0/", "flashinfer_decode_fp16_tc_B1_N128K",
     "graph_us", 1 * 131072 * 8 * 128 * 2 * 2, "Hq 32 / Hkv 8 / d 128, f16 K and V; the library's path (KernelPath::kAuto, path 0)"),
    ("dense_B8_N128K", "BM_DenseDecode/0/8/131072/0/", "flashinfer_decode_fp16_tc_B8_N128K",
     "graph_us", 8 * 131072 * 8 * 128 * 2 * 2, "Hq 32 / Hkv 8 / d 128, f16 K and V"),
    ("dense_B1_N128K_vs_sdpa", "BM_DenseDecode/0/1/131072/0/", "sdpa_decode_B1_N128K", "us",
     1 * 131072 * 8 * 128 * 2 * 2, "as dense_B1_N128K, against PyTorch SDPA (the issue's dense "
     "anchor)"),
    ("dense_B8_N128K_vs_sdpa", "BM_DenseDecode/0/8/131072/0/", "sdpa_decode_B8_N128K", "us",
     8 * 131072 * 8 * 128 * 2 * 2, "as dense_B8_N128K, against PyTorch SDPA"),
    ("dense_B8_N128K_vs_flashinfer_cuda", "BM_DenseDecode/0/8/131072/0/",
     "flashinfer_decode_fp16_cuda_B8_N128K", "graph_us", 8 * 131072 * 8 * 128 * 2 * 2,
     "as dense_B8_N128K, against FlashInfer's paged decode without tensor cores (its tensor-core "
     "decode needs the prefill module, which an anchor bundle built with FI_MODULES='topk "
     "decode_fp16 decode_fp8' lacks)"),
    ("attn_select_B1_N128K", "BM_BlockSelectExact/0/1/3/0/0/1/", None, None, None,
     "the library's path (KernelPath::kAuto, path 0), top 8 x 32 + ring 1024, fp16k_q4v"),
    ("attn_select_B8_N128K", "BM_BlockSelectExact/0/8/3/0/0/1/", None, None, None,
     "as attn_select_B1_N128K"),
    ("topk_64x131072_k2048", "BM_TopK/64/131072/2048/", "flashinfer_topk_unsorted_64x131072_k2048",
     "us", 64 * 131072 * 4, "f32 scores read once; torch.topk in the same run: see performance.md"),
    ("topk_1x131072_k2048", "BM_TopK/1/131072/2048/", "flashinfer_topk_unsorted_1x131072_k2048",
     "us", 1 * 131072 * 4, "f32 scores read once"),
    ("topk_64x262144_k2048", "BM_TopK/64/262144/2048/", "flashinfer_topk_unsorted_64x262144_k2048",
     "us", 64 * 262144 * 4, "f32 scores read once"),
    # DeepSelect's fp32 kernel in kvc's harness (ANCHORS=deepselect_bin; the issue's "at least as
    # fast as DeepSelect on the same shapes in the same run").
    ("topk_64x131072_k2048_vs_deepselect", "BM_TopK/64/131072/2048/",
     "deepselect_unsorted_64x131072_k2048", "us", 64 * 131072 * 4,
     "anchor: DeepSelect's fp32 top-k (unsorted indices; benchmarks/anchors/"
     "deepselect_topk_anchor.cu)"),
    ("topk_1x131072_k2048_vs_deepselect", "BM_TopK/1/131072/2048/",
     "deepselect_unsorted_1x131072_k2048", "us", 1 * 131072 * 4, "as above"),
    ("topk_64x262144_k2048_vs_deepselect", "BM_TopK/64/262144/2048/",
     "deepselect_unsorted_64x262144_k2048", "us", 64 * 262144 * 4, "as above"),
    ("ingest_16K", "BM_Ingest/T:16384/format:3/index:1/kernels:0/", None, None, None,
     "fp16k_q4v with the mxfp4 index copy (what the default scoring needs)"),
    ("append_B64", "BM_AppendStep/B:64/index:1/kernels:0/", None, None, None,
     "one decode token per sequence, with the mxfp4 index copy"),
    ("dsv4_index_B1_T1", "BM_Dsv4IndexDecode/1/1/0/0/0/", None, None, 131072 * 68,
     "131072 mxfp4 entries x 64 heads, one query token"),
    ("dsv4_topk_1x262144_k2048", "BM_Dsv4TopK/1/262144/2048/0/0/", None, None, 262144 * 4,
     "f32 logits read once"),
    ("dsv4_csa_B1_1M", "BM_Dsv4CsaDecode/1/0/0/", "torch_csa_decode_1M_B1", "graph_us", None,
     "bf16 entries, window 128 + top 512 of 262144, 64 heads x 512"),
    ("dsv4_hca_B1_1M", "BM_Dsv4HcaDecode/1/0/0/", "torch_hca_decode_1M_B1", "graph_us", None,
     "bf16 entries, window 128 + all 8192 entries"),
    # The peers of issue #13 (ANCHORS="flashmla deepgemm"; first run 2026-12-04, session 22).
    ("dsv4_csa_model1_B1_1M", "BM_Dsv4CsaDecode/1/1/0/0/", "flashmla_csa_decode_1M_B1",
     "graph_us", None, "MODEL1 FP8 entries (FlashMLA's MODEL1_FP8Sparse pages), window 128 + "
     "top 512 of 262144, 64 heads x 512; anchor: FlashMLA's SM90 sparse FP8 decode"),
    ("dsv4_csa_model1_B8_1M", "BM_Dsv4CsaDecode/8/1/0/0/", "flashmla_csa_decode_1M_B8",
     "graph_us", None, "as dsv4_csa_model1_B1_1M"),
    ("dsv4_hca_model1_B1_1M", "BM_Dsv4HcaDecode/1/1/0/0/", "flashmla_hca_decode_1M_B1",
     "graph_us", None, "MODEL1 FP8 entries, window 128 + all 8192 entries; anchor as "
     "dsv4_csa_model1_B1_1M"),
    ("dsv4_hca_model1_B8_1M", "BM_Dsv4HcaDecode/8/1/0/0/", "flashmla_hca_decode_1M_B8",
     "graph_us", None, "as dsv4_hca_model1_B1_1M"),
    ("dsv4_index_fp8_B1_T1", "BM_Dsv4IndexDecode/1/1/1/0/0/",
     "deepgemm_fp8_paged_mqa_logits_B1_T1_N131072", "graph_us", 131072 * 132,
     "131072 fp8 + scale keys x 64 heads, one query token (DeepSeek-V3.2's format); anchor: "
     "DeepGEMM's SM90 fp8 paged MQA logits"),
]


def floor_of(row, fixed):
    if fixed is not None:
        return fixed / (HBM_TBPS * 1e6)
    if row.get("gbps"):
        return row["us"] * row["gbps"] / (HBM_TBPS * 1e3)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--date", required=True)
    ap.add_argument("--command", required=True)
    # The GPU the run's own metadata names (its anchors'); --gpu only where a run has none. (Until
    # the thirty-ninth session this defaulted to "NVIDIA H200 (132 SMs)", which mislabelled the
    # thirty-seventh session's H100 run.)
    ap.add_argument("--gpu", default=None)
    ap.add_argument("--out", default="docs/perf-data/latest.json")
    a = ap.parse_args()
    bench = perf_report.load_benchmarks(a.run_dir)
    anchors, meta, _ = perf_report.load_anchors(a.run_dir)
    gpu = a.gpu or (f"{meta['gpu']} ({meta.get('sms')} SMs)" if meta.get("gpu") else None)
    if gpu is None:
        ap.error("the run names no GPU in its metadata: pass --gpu")
    rows = []
    for name, prefix, anchor, field, fixed, note in ROWS:
        k = next((bench[n] for n in bench if n.startswith(prefix)), None)
        an = anchors.get(anchor) if anchor else None
        ref = an.get(field) if an else None
        missing = []
        if k is None:
            missing.append(f"kvc row {prefix} not in this run")
        if anchor and ref is None:
            missing.append(f"anchor {anchor} not in this run")
        fl = floor_of(k, fixed) if k else (fixed / (HBM_TBPS * 1e6) if fixed else None)
        rows.append({
            "name": name,
            "kvc_us": round(k["us"], 2) if k else None,
            "anchor": anchor,
            "anchor_us": round(ref, 2) if ref else None,
            "floor_us": round(fl, 2) if fl else None,
            "note": "; ".join([note] + missing),
        })
    doc = {"date": a.date, "gpu": gpu, "command": a.command,
           "raw": os.path.relpath(a.run_dir),
           "floor_basis": f"floor_us: the row's bytes at {HBM_TBPS} TB/s, the H200's measured read "
                          "bandwidth, whatever GPU ran the row (an H100's HBM3 reads about "
                          "3.35 TB/s, so its own floors are about 1.37x these)",
           "rows": rows}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for r in rows:
        print(r["name"], r["kvc_us"], r["anchor_us"], r["floor_us"])


if __name__ == "__main__":
    main()
