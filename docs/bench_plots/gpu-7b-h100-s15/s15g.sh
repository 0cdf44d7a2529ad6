source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120"
mkdir -p /tmp/orig && cp pipeline/core.py pipeline/config.py /tmp/orig/
alt() { cp .device/alt/pipeline/*.py pipeline/; }
orig() { cp /tmp/orig/*.py pipeline/; }
date -u +%T; $B --concurrency 4,16,32 --turns 2 --out $OUT/base2 > $OUT/base2.log 2>&1; echo "base2 rc=$?"; date -u +%T
alt; $B --concurrency 4,16,32 --turns 2 --stage-config .device/alt.yaml --out $OUT/alt2 > $OUT/alt2.log 2>&1; echo "alt2 rc=$?"; date -u +%T
orig; $B --concurrency 16,64 --turns 1 --out $OUT/base1 > $OUT/base1.log 2>&1; echo "base1 rc=$?"; date -u +%T
alt; $B --concurrency 16,64 --turns 1 --stage-config .device/alt.yaml --out $OUT/alt1 > $OUT/alt1.log 2>&1; echo "alt1 rc=$?"; date -u +%T
for x in base2 alt2 base1 alt1; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ " | head -6; rm -f $OUT/$x/*.png $OUT/$x/results.json; python3 scripts/first_chunk_wait.py $OUT/$x.log | tail -n +3; done
ls $OUT
