#!/usr/bin/env bash
# Draws latency-vs-rate curves from `pdserve bench --sweep R1,R2,... --csv FILE` output:
# TTFT, TPOT and end-to-end latency (p50 and p99) and throughput against the request rate, one
# line per policy (or per server) found in the files. Rows at rate "inf" are left out.
#
#   bench/plot.sh OUT.png FILE.csv [FILE.csv ...]
#
# Needs gnuplot (Debian: gnuplot-nox, installed by scripts/setup.sh).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bench/plot.sh OUT.png FILE.csv [FILE.csv ...]" >&2
  exit 2
fi
out=$1
shift
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot is not installed (apt-get install gnuplot-nox)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One data file per policy (first column), numeric rates only, sorted by rate.
header=$(head -n 1 "$1")
for f in "$@"; do
  [ "$(head -n 1 "$f")" = "$header" ] || { echo "plot.sh: $f has different columns from $1" >&2; exit 1; }
  tail -n +2 "$f"
done | awk -F, -v dir="$tmp" '$2 != "inf" { gsub(/[^A-Za-z0-9_.-]/, "_", $1); print > (dir "/" $1 ".dat") }'
series=("$tmp"/*.dat)
[ -e "${series[0]}" ] || { echo "plot.sh: no rows with a finite request rate" >&2; exit 1; }
for s in "${series[@]}"; do sort -t, -k2,2g -o "$s" "$s"; done

col() {  # Column number of a header name.
  echo "$header" | tr ',' '\n' | grep -nx "$1" | cut -d: -f1
}
rate=$(col request_rate)
plot_cmd() {  # plot_cmd COLUMN TITLE_SUFFIX DASH
  local c
  c=$(col "$1")
  local parts=()
  for s in "${series[@]}"; do
    local name
    name=$(basename "$s" .dat)
    parts+=("'$s' using $rate:$c with linespoints dt $3 title '$name $2'")
  done
  local IFS=,
  echo "${parts[*]}"
}

gnuplot <<GP
set terminal pngcairo size 1400,1000 noenhanced
set output '$out'
set datafile separator ','
set key top left
set grid
set xlabel 'request rate (req/s)'
set multiplot layout 2,2 title 'pdserve bench: latency and throughput vs request rate'
set ylabel 'ms'
set title 'Time to first token'
plot $(plot_cmd ttft_p50_ms p50 1), $(plot_cmd ttft_p99_ms p99 2)
set title 'Time per output token'
plot $(plot_cmd tpot_p50_ms p50 1), $(plot_cmd tpot_p99_ms p99 2)
set title 'End-to-end latency'
plot $(plot_cmd e2el_p50_ms p50 1), $(plot_cmd e2el_p99_ms p99 2)
set title 'Throughput'
set ylabel 'req/s'
plot $(plot_cmd requests_per_second 'req/s' 1), $(plot_cmd goodput 'goodput' 2)
unset multiplot
GP
echo "plot.sh: wrote $out" >&2
