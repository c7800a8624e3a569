#!/usr/bin/env bash
# Device calls of the fifteenth session, 2026-12-04 (each under the 10-minute limit; results in
# $OUT, helpers in scripts/gpu-lib.sh):
#   first  build (sm_90a) of the CUDA tests, index_bench, step_bench and dsv4_bench; the token-score
#          and BlockIndex GPU tests (every chunk-kernel variant against the CPU, kStreamRows among
#          them), the decode-step tests, the DeepSeek-V4 sparse-attention tests; index_bench's token
#          rows (kStreamLean against kStreamRows / 4 / 8 and the cp.async word staging) at B1 / B8
#          N128K for h32x8x128 and SmolLM2's shape; step_bench's default and mean-K rows;
#          dsv4_bench's CSA / HCA rows; Nsight Compute of the kStreamRows chunk kernel at B8
#   second the index copy's mxfp4 words rearranged (magnitudes and signs apart) and the unpacking's
#          shifts as multiplies; the sparse-attention rework: every GPU test; the token rows (mass
#          and max), step_bench, dsv4_bench's CSA / HCA rows, store_bench's append and ingest rows;
#          Nsight Compute of the kStreamRows chunk kernel at B8 and of it and the finish at B1
#   final  the same code: memcheck over the token-score extreme-scale test (every chunk-kernel
#          variant), the store-update and extreme-key store tests (the index copy's words) and the
#          sparse-attention tests; racecheck and synccheck over the extreme-scale test and two
#          sparse-attention shapes; step_bench's default and mean-K rows with PyTorch's SDPA and
#          block-select step (benchmarks/anchors/torch_anchors.py) in the same call; dsv4_bench's
#          CSA / HCA rows (new and old kernels) with dsv4_anchors.py
#   prof   Nsight Compute of the pipelined sparse attention (and its combine) at HCA B1 / B8 and
#          CSA B1, MODEL1 entries, 1M tokens
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$PWD/gpu-out/session15
source scripts/gpu-lib.sh

token_rows='BM_Score/h32x8x128/B(1|8)/N131072/token_mass/mxfp4/sum/fast-(stream_lean|stream_rows.*|stream_async)/'
token_rows+='|BM_Score/smollm2/B(1|8)/N131072/token_mass/mxfp4/sum/fast-(stream_lean|stream_rows)/'

case "${1:-first}" in
  first)
    build_targets kvc_cuda_tests index_bench step_bench dsv4_bench
    gtests token '*TokenScore*:*Cuda_BlockIndex*:*DecodeStep*' 200
    gtests dsv4attn '*Cuda_Dsv4_Attention*:*Cuda_Dsv4_Pipeline*' 120
    bench 120 index_bench "$token_rows"
    bench 60 step_bench 'BM_DecodeStep/(1|8)/131072/0/(1|2)/(0|1)/'
    bench 45 dsv4_bench 'BM_Dsv4CsaDecode|BM_Dsv4HcaDecode'
    NCU_STALLS=1 profile rows-b8 index_bench \
      'BM_Score/h32x8x128/B8/N131072/token_mass/mxfp4/sum/fast-stream_rows/' 'token_stream_kernel'
    report
    ;;
  second)
    build_targets kvc_cuda_tests index_bench step_bench dsv4_bench store_bench
    gtests all '*' 240
    bench 150 index_bench "$token_rows|BM_Score/h32x8x128/B8/N131072/token_max/mxfp4/sum/fast-stream_(lean|rows)/"
    bench 60 step_bench 'BM_DecodeStep/(1|8)/131072/0/(1|2)/(0|1)/|BM_DecodeStep/32/32768/0/1/1/'
    bench 45 dsv4_bench 'BM_Dsv4CsaDecode|BM_Dsv4HcaDecode'
    bench 40 store_bench 'BM_AppendStep/|BM_Ingest/'
    NCU_STALLS=1 profile rows-b8 index_bench \
      'BM_Score/h32x8x128/B8/N131072/token_mass/mxfp4/sum/fast-stream_rows/' 'token_stream_kernel'
    NCU_COUNT=2 profile rows-b1 index_bench \
      'BM_Score/h32x8x128/B1/N131072/token_mass/mxfp4/sum/fast-stream_rows/' \
      'token_stream_kernel|token_mass_finish_kernel'
    report
    ;;
  final)
    build_targets kvc_cuda_tests step_bench dsv4_bench
    sanitize memcheck memcheck \
      'Cuda_BlockIndex_TokenScores.ExtremeScales*:Cuda_StoreUpdate_Formats.*:Cuda_KvStore.ExtremeKeysMatchCpu:Cuda_Dsv4_Attention.*' \
      130
    sanitize racecheck racecheck \
      'Cuda_BlockIndex_TokenScores.ExtremeScales*:*Cuda_Dsv4_Attention*hca_model1_h8*:*Cuda_Dsv4_Attention*csa_bf16_h64_b2*' \
      80
    bench 50 step_bench 'BM_DecodeStep/(1|8)/131072/0/(1|2)/(0|1)/|BM_DecodeStep/32/32768/0/1/1/'
    OUT="$out" timeout 100 python3 benchmarks/anchors/torch_anchors.py > "$out/torch_anchors.log" 2>&1
    say "torch anchors: rc=$? $(grep -E 'sdpa_decode_B8|block_select' "$out/torch_anchors.log" | tr -s ' ' | tr '\n' ';')"
    bench 40 dsv4_bench 'BM_Dsv4(Csa|Hca)Decode/(1|8)/(0|1)/0/(0|1)/'
    OUT="$out" timeout 60 python3 benchmarks/anchors/dsv4_anchors.py > "$out/dsv4_anchors.log" 2>&1
    say "dsv4 anchors: rc=$? $(tail -4 "$out/dsv4_anchors.log" | tr -s ' ' | tr '\n' ';')"
    sanitize synccheck synccheck \
      'Cuda_BlockIndex_TokenScores.ExtremeScales*:*Cuda_Dsv4_Attention*hca_model1_h8*' 60
    report
    ;;
  prof)
    build_targets dsv4_bench
    NCU_STALLS=1 NCU_COUNT=2 profile hca-b1 dsv4_bench 'BM_Dsv4HcaDecode/1/1/0/0/' \
      'attention_kernel|combine_kernel'
    NCU_STALLS=1 NCU_COUNT=2 profile csa-b1 dsv4_bench 'BM_Dsv4CsaDecode/1/1/0/0/' \
      'attention_kernel|combine_kernel'
    NCU_STALLS=1 profile hca-b8 dsv4_bench 'BM_Dsv4HcaDecode/8/1/0/0/' 'attention_kernel'
    ;;
  *) echo "gpu-session15.sh: first | second | final | prof" >&2; exit 2 ;;
esac
finish
