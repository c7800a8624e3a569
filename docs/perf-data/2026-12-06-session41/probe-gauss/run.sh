#!/usr/bin/env bash
# The spread top-k's phase probe of main (tree: the 4096-score sample) and of 41db1bf (base: 8192)
# at the shapes where topk_bench's normal scores and the probe's uniform ones disagreed.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name --format=csv,noheader
for rep in 1 2; do
for shape in "262144 1 64" "262144 0 64" "131072 1 64" "131072 1 1" "262144 1 1"; do
  set -- $shape
  for v in tree base; do
    echo "== $v N $1 dist $2 rows $3 (rep $rep)"
    timeout 30 ./probe-$v "$1" 2048 "$2" 0 1 1 1 "$3" |
      grep -E "ids wrong|grid sync|sample (cut|append|count)|rank (counted|scattered)|end \(|graph replay"
  done
done
done
