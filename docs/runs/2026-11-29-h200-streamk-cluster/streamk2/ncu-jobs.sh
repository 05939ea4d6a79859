#!/usr/bin/env bash
# ncu on the candidate launches of hand-made worker jobs (committed pipe vs stream-K v2).
OUT="${OUT:-/tmp/out}"
M=$(cat .gpu/jobs/metrics.txt)
for j in pipe-s1024 sk2-s1024 pipe-s4096 sk2-s4096; do
  echo "== $j"
  timeout 120 /usr/local/cuda/bin/ncu --clock-control none --csv --page raw --metrics "$M",launch__grid_size \
     -k regex:gqa_decode_f16 .gpu/bin/cargo-kopt kopt __worker --device 0 --oneshot .gpu/jobs/$j.json \
     --report-file "$OUT/$j.report.json" > "$OUT/$j.csv" 2> "$OUT/$j.err"
  echo "rc $? $(grep -c '^\"[0-9]' "$OUT/$j.csv") launches"
done
