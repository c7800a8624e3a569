#!/usr/bin/env bash
# Runs every peer anchor of issue #12 item 7 on the GPU machine in one call and writes their JSON
# under $OUT: sets up the bundle (setup-anchors.sh; the header there says which `carry` paths
# each call needs), then each anchor under its own hard timeout, all within one deadline, so the
# call ends inside the device's 10-minute limit. An anchor that is missing a piece, fails or
# times out still gets an entry, with the reason.
#
# Usage: benchmarks/anchors/run-anchors.sh [OUT_DIR]          (default $OUT, else ./anchors-out)
# Environment:
#   ANCHORS   which, in order (default all but flashmla and deepgemm): flashinfer_decode
#             flashinfer_topk cub deepselect torch; flashmla (FlashMLA's SM90 sparse FP8 decode
#             against kvc's DeepSeek-V4 attention: builds from .anchors/flashmla, or
#             $FLASHMLA_BUNDLE, first; flashmla_anchor.sh) and deepgemm (DeepGEMM's SM90 FP8
#             paged MQA logits against kvc's indexer decode: builds from .anchors/deepgemm, or
#             $DEEPGEMM_BUNDLE; deepgemm_anchor.sh); their build logs land in OUT_DIR; and
#             deepselect_bin (DeepSelect's fp32 top-k kernel without torch: runs the carried binary
#             .anchors/p*/bin/deepselect_topk_anchor, or $DEEPSELECT_TOPK_ANCHOR_BIN, built by
#             deepselect_topk_anchor.sh; carry .anchors/p1/bin; DEEPSELECT_TOPK_ARGS passes e.g.
#             "--mode unsorted --shapes large"; a shape whose check fails is a row with "us": null);
#             flashmla_pages (FlashMLA's sparse FP8 decode over MODEL1 pages kvc wrote into
#             engine-owned pools, against kvc's CUDA attention and a float32 reference:
#             flashmla_kvc_pages.py; builds FlashMLA as flashmla does, or reuses that build; needs
#             kvc's Python module in build-gpu/python: cmake -DKVC_BUILD_PYTHON=ON, target _kvc)
#   DEADLINE  seconds for the whole script (default 540); an anchor gets
#             min(its timeout, the time left - 20 s) and none starts with under 40 s left
#   T_<name>  one anchor's timeout in seconds (defaults: torch 240, flashinfer_decode 240,
#             flashinfer_topk 300, deepselect 240 (+600 when it builds from source), cub 240,
#             flashmla 600, deepgemm 600, deepselect_bin 240, flashmla_pages 600)
#   ANCHORS_ALLOW_JIT=1  let FlashInfer JIT-compile a module the bundle lacks (minutes each;
#             needs the full package with its headers); default off, so a miss fails its rows
#   ANCHORS_KEEP_FILES=1 also copy each anchor's own JSON and log into OUT_DIR (more files)
#   FLASHINFER_TOPK_ARGS extra arguments of flashinfer_topk_anchor.py (e.g. --large: the large-k
#             shapes only)
# Writes two files (the device returns at most 8 per call):
#   anchors.json  {"meta": {...}, "anchors": {name: {"status", "reason", "seconds", "rc",
#                 "result": the anchor's own JSON}}}
#   anchors.log   setup-anchors.sh's report and every anchor's output, in order
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-${OUT:-$repo/anchors-out}}"
mkdir -p "$out"
work="$(mktemp -d /tmp/anchors-run.XXXXXX)"
log="$out/anchors.log"
t0=$(date +%s)
deadline=${DEADLINE:-540}
left() { echo $(( deadline - ($(date +%s) - t0) )); }
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
: > "$log"

"$here/setup-anchors.sh" >> "$log" 2>&1
env_file="$repo/.anchors/site/anchors.env"
if [ -f "$env_file" ]; then . "$env_file"; else echo "run-anchors: no $env_file" >> "$log"; fi
[ "${ANCHORS_ALLOW_JIT:-0}" = 1 ] || export FLASHINFER_DISABLE_JIT=1

# One anchor: name, default timeout, then the command (its JSON at $work/$name.json).
run_one() {
  local name=$1 limit=$2 start rc status reason
  shift 2
  local var="T_$name"
  limit=${!var:-$limit}
  local l
  l=$(left)
  start=$(date +%s)
  if [ "$l" -lt 40 ]; then
    echo "{\"status\": \"skipped\", \"reason\": \"deadline: $l s of DEADLINE=$deadline left\"}" > "$work/$name.status"
    echo "=== $name: skipped (deadline)" >> "$log"
    return
  fi
  [ "$limit" -gt $((l - 20)) ] && limit=$((l - 20))
  echo "=== $name (timeout $limit s) at $((start - t0)) s: $*" >> "$log"
  timeout -k 10 "$limit" "$@" > "$work/$name.log" 2>&1
  rc=$?
  cat "$work/$name.log" >> "$log"
  status=ok reason=""
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timeout reason="killed after $limit s"
  elif [ $rc -ne 0 ]; then status=failed reason="exit $rc: $(tail -3 "$work/$name.log" | tr '\n"\\' '   ' | cut -c1-400)"
  elif [ ! -s "$work/$name.json" ]; then status=failed reason="exit 0 but no JSON written"
  fi
  "$py" - "$work/$name.status" "$status" "$reason" "$(( $(date +%s) - start ))" "$rc" <<'EOF'
import json, sys
path, status, reason, seconds, rc = sys.argv[1:]
json.dump(dict(status=status, reason=reason or None, seconds=int(seconds), rc=int(rc)), open(path, "w"))
EOF
  echo "=== $name: $status in $(( $(date +%s) - start )) s ${reason:+($reason)}" >> "$log"
}

for name in ${ANCHORS:-flashinfer_decode flashinfer_topk cub deepselect torch}; do
  case $name in
    torch) run_one torch 240 sh -c "OUT='$work' '$py' '$here/torch_anchors.py' && mv '$work/torch_anchors.json' '$work/torch.json'" ;;
    flashinfer_decode) run_one flashinfer_decode 240 sh -c "OUT='$work' '$py' '$here/flashinfer_anchors.py' && mv '$work/flashinfer_anchors.json' '$work/flashinfer_decode.json'" ;;
    flashinfer_topk) run_one flashinfer_topk 300 "$py" "$here/flashinfer_topk_anchor.py" --out "$work/flashinfer_topk.json" ${FLASHINFER_TOPK_ARGS:-} ;;
    deepselect)
      if [ -n "${DEEPSELECT_SRC:-}" ]; then
        run_one deepselect 840 sh -c "'$here/deepselect_anchor.sh' '$DEEPSELECT_SRC' '$work/ds' && cp '$work/ds/deepselect_anchor.json' '$work/deepselect.json'"
      else
        # torch.topk on DeepSelect's shapes still runs; deep_select only where a wheel with sm_90 was installed.
        run_one deepselect 240 env PYTHONPATH="${DEEPSELECT_SITE:+$DEEPSELECT_SITE:}${PYTHONPATH:-}" \
          "$py" "$here/deepselect_anchor.py" --out "$work/deepselect.json"
      fi ;;
    cub) run_one cub 240 sh -c "'$here/cub_topk_anchor.sh' '$work/cubdir' && cp '$work/cubdir/cub_topk_anchor.json' '$work/cub.json'" ;;
    deepselect_bin)
      # A carried file may lose its execute bit: run a copy.
      ds_bin="${DEEPSELECT_TOPK_ANCHOR_BIN:-$(ls "$repo"/.anchors/p*/bin/deepselect_topk_anchor 2>/dev/null | head -1)}"
      run_one deepselect_bin 240 sh -c "if [ ! -f '$ds_bin' ]; then echo 'no deepselect_topk_anchor binary: build it with benchmarks/anchors/deepselect_topk_anchor.sh and carry .anchors/p1/bin'; exit 1; fi; cp '$ds_bin' '$work/deepselect_topk_anchor' && chmod +x '$work/deepselect_topk_anchor' && '$work/deepselect_topk_anchor' ${DEEPSELECT_TOPK_ARGS:-} > '$work/deepselect_bin.json'" ;;
    # FlashMLA and DeepGEMM build from their source bundles first (minutes): not in the default list.
    flashmla) run_one flashmla 600 sh -c "'$here/flashmla_anchor.sh' '${FLASHMLA_BUNDLE:-$repo/.anchors/flashmla}' '$work/fm'; rc=\$?; cp '$work/fm/flashmla_build.log' '$out/flashmla_build.log' 2>/dev/null; [ \$rc -eq 0 ] && cp '$work/fm/flashmla.json' '$work/flashmla.json'" ;;
    flashmla_pages)
      # FlashMLA's build (reused when the flashmla anchor built it in this call), then the check.
      run_one flashmla_pages 600 sh -c "if [ ! -d '$repo/build-gpu/python/kvc' ]; then echo 'no kvc Python module in build-gpu/python (cmake -DKVC_BUILD_PYTHON=ON, target _kvc)'; exit 1; fi; FLASHMLA_REUSE=1 FLASHMLA_ONLY_BUILD=1 '$here/flashmla_anchor.sh' '${FLASHMLA_BUNDLE:-$repo/.anchors/flashmla}' '$work/fmp' || exit 1; PYTHONPATH='/tmp/flashmla-build/FlashMLA:$repo/build-gpu/python' '$py' -X faulthandler '$here/flashmla_kvc_pages.py' --out '$work/flashmla_pages.json'" ;;
    deepgemm) run_one deepgemm 600 sh -c "'$here/deepgemm_anchor.sh' '${DEEPGEMM_BUNDLE:-$repo/.anchors/deepgemm}' '$work/dg'; rc=\$?; cp '$work/dg/deepgemm_build.log' '$out/deepgemm_build.log' 2>/dev/null; [ \$rc -eq 0 ] && cp '$work/dg/deepgemm.json' '$work/deepgemm.json'" ;;
    *) echo "=== $name: unknown anchor" >> "$log" ;;
  esac
  # A file name the device returns must be plain: copy the per-anchor files only when asked.
  if [ "${ANCHORS_KEEP_FILES:-0}" = 1 ] && [ -f "$work/$name.json" ]; then cp "$work/$name.json" "$out/anchor_$name.json"; fi
done

"$py" - "$work" "$out/anchors.json" "${ANCHORS:-flashinfer_decode flashinfer_topk cub deepselect torch}" "${DEEPSELECT_NOTE:-}" "$(left)" <<'EOF'
import json, os, subprocess, sys, time
work, path, names, ds_note, left = sys.argv[1:]
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def git(*a):
    try:
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
setup = open(os.path.join(os.path.dirname(path), "anchors.log")).read().split("=== ")[0]
doc = dict(meta=dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), commit=git("rev-parse", "HEAD"),
                     dirty=bool(git("status", "--porcelain", "--untracked-files=no")),
                     flashinfer_disable_jit=os.environ.get("FLASHINFER_DISABLE_JIT", ""),
                     deepselect=ds_note or None, seconds_left=int(left), setup=setup.splitlines()),
           anchors={})
for name in names.split():
    entry = load(os.path.join(work, f"{name}.status")) or dict(status="not run", reason="no status")
    entry["result"] = load(os.path.join(work, f"{name}.json"))
    if entry["result"] and entry["result"].get("skipped"):
        entry["status"], entry["reason"] = "skipped", entry["result"]["skipped"]
    doc["anchors"][name] = entry
json.dump(doc, open(path, "w"), indent=1)
for name, e in doc["anchors"].items():
    rows = len((e.get("result") or {}).get("rows", []))
    print(f"{name:18s} {e['status']:8s} {e.get('seconds', '-')!s:>5s} s  {rows:3d} rows  {e.get('reason') or ''}")
print(f"wrote {path}")
EOF
rm -rf "$work"
