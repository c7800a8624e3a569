#!/usr/bin/env python3
"""Copies the DeepSeek-V4 golden cases kvc's tests use from the shared reference set into
tests/dsv4/golden/<case>/, keeping every file under ~2 MB: where a case is larger, only a prefix
of its query rows is kept (rows are independent queries there, so a prefix is itself a valid
case), and the manifest excerpt in PROVENANCE.md records the shapes as copied.

Usage: tests/dsv4/golden/copy_cases.py [SOURCE]   (SOURCE: .../reference/dsv4-golden)
Plain Python 3, no numpy: tensors are raw little-endian row-major, so a prefix of rows is a
prefix of bytes.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Default: ../shared/reference/dsv4-golden beside the checkout (this file is tests/dsv4/golden/).
SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    HERE, "..", "..", "..", "..", "shared", "reference", "dsv4-golden")
SIZE = {"bf16": 2, "f32": 4, "i32": 4, "u8": 1}

# case -> (tensors to copy, {tensor: rows kept} for the prefixed ones)
CASES = {
    "quant_fp4": (["x", "dequant", "codes", "packed", "scale_ue8m0"], {}),
    "quant_fp8_b64": (["x", "dequant", "codes", "scale_ue8m0"], {}),
    "quant_fp8_b128": (["x", "codes", "scale"], {}),
    "hadamard128": (["x", "y"], {}),
    "rope": (["x", "y", "y_inverse", "cos_compressed_layer", "sin_compressed_layer"], {}),
    "compressor_r4_indexer": (["kv_proj", "score_proj", "ape", "norm_w", "cos", "sin", "pooled",
                               "entries", "state_kv_after_prefill", "state_score_after_prefill"], {}),
    "compressor_r4_main": (["kv_proj", "score_proj", "ape", "norm_w", "cos", "sin", "pooled",
                            "entries", "state_kv_after_prefill", "state_score_after_prefill"], {}),
    "compressor_r128_main": (["kv_proj", "score_proj", "ape", "norm_w", "cos", "sin", "pooled",
                              "entries", "state_kv_after_prefill", "state_score_after_prefill"], {}),
    "indexer_v4_prefill": (["q_raw", "cos", "sin", "q_sim", "k_pre_rotation", "k_sim", "w_raw",
                            "w_scaled", "scores_f32", "topk16_idx", "topk512_idx"],
                           {t: 64 for t in ["q_raw", "cos", "sin", "q_sim", "w_raw", "w_scaled",
                                            "scores_f32", "topk16_idx", "topk512_idx"]}),
    "indexer_v4_decode": (["q_sim", "k_sim", "w_scaled", "scores_f32", "topk16_idx"], {}),
    "indexer_v32_fp8": (["q_rotated", "k_rotated", "q_fp8_codes", "q_scale", "k_fp8_codes",
                         "k_scale", "w_raw", "scores_f32", "topk16_idx"],
                        {t: 32 for t in ["q_rotated", "q_fp8_codes", "q_scale", "w_raw",
                                         "scores_f32", "topk16_idx"]}),
    "model1_fp8_kv_cache": (["kv", "pages"], {}),
    "fp4_index_k_cache": (["k", "dequant", "pages"], {}),
    "sparse_attn_r4_prefill": (["q", "kv", "attn_sink", "idx", "o_exact_f32"],
                               {"q": 64, "idx": 64, "o_exact_f32": 64}),
    "sparse_attn_r128_prefill": (["q", "kv", "attn_sink", "idx", "o_exact_f32"],
                                 {"q": 140, "idx": 140, "o_exact_f32": 140}),
    "sparse_attn_r128_decode": (["q", "kv_cache", "attn_sink", "idx", "o_exact_f32"], {}),
}


def write_provenance(out_dir, case, tensors, params, manifest):
    lines = [
        "# Golden case `%s`: provenance" % case,
        "",
        "Copied by `tests/dsv4/golden/copy_cases.py` from the shared reference set",
        "`reference/dsv4-golden/%s/` (its `manifest.json`), unchanged except where a tensor below" % case,
        "lists `source_rows`: then only its first `shape[0]` rows are kept (rows are independent",
        "queries, so the prefix is itself a valid case).",
        "",
        "Generator: %s." % manifest["generator"],
        "The semantics it follows: `reference/dsv4_semantics.md` (DeepSeek's own code, with commits",
        "and line numbers); sources: " + "; ".join("%s: %s" % kv for kv in manifest["sources"].items()) + ".",
        "",
        "Format: %s." % manifest["format"],
        "",
        "Manifest excerpt (as copied):",
        "",
        "```json",
        json.dumps({"tensors": tensors, "params": params}, indent=1),
        "```",
        "",
    ]
    open(os.path.join(out_dir, "PROVENANCE.md"), "w").write("\n".join(lines))


def main():
    manifest = json.load(open(os.path.join(SRC, "manifest.json")))
    excerpt = {"format": manifest["format"], "generator": manifest["generator"],
               "sources": manifest["sources"], "cases": {}}
    for case, (names, prefix) in CASES.items():
        info = manifest["cases"][case]
        out_dir = os.path.join(HERE, case)
        os.makedirs(out_dir, exist_ok=True)
        tensors = {}
        for name in names:
            t = dict(info["tensors"][name])
            data = open(os.path.join(SRC, t["file"]), "rb").read()
            row = SIZE[t["dtype"]]
            for s in t["shape"][1:]:
                row *= s
            if name in prefix:
                t["source_rows"] = t["shape"][0]
                t["shape"] = [prefix[name]] + t["shape"][1:]
                data = data[: prefix[name] * row]
            assert len(data) <= 2 * 1024 * 1024, (case, name, len(data))
            open(os.path.join(out_dir, name + ".bin"), "wb").write(data)
            t["file"] = case + "/" + name + ".bin"
            tensors[name] = t
        excerpt["cases"][case] = {"tensors": tensors, "params": info["params"]}
        write_provenance(out_dir, case, tensors, info["params"], manifest)
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump(excerpt, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
