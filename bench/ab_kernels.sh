#!/bin/bash
# Two kernels_bench binaries (before and after a change) side by side on a noisy machine: ROUNDS
# interleaved runs of each on the benchmarks FILTER matches; prints each binary's best
# bytes_per_second (GB/s) per benchmark (the best of several runs estimates what the code can do;
# a single run mostly measures the neighbours).
#   bench/ab_kernels.sh /tmp/kernels_bench.before build/bench/kernels_bench 'BM_LinearQuantized/type:2/m:16/threads:1' 5
set -euo pipefail
A=$1 B=$2 FILTER=$3 ROUNDS=${4:-5}
for _ in $(seq "$ROUNDS"); do
  for label in A B; do
    "${!label}" --benchmark_filter="$FILTER" --benchmark_min_time=0.3 2>/dev/null | grep '^BM_' |
      sed -E 's/^(BM_[^ ]*).*bytes_per_second=([0-9.]+)([GM])\/s.*/\1 \2 \3/' |
      awk -v l="$label" '{v = $2; if ($3 == "M") v /= 1000; print l, $1, v}'
  done
done | awk '{k = $1 " " $2; if (!(k in best) || $3 > best[k]) best[k] = $3}
            END {for (k in best) print k, best[k]}' | sort -k2,2 -k1,1
