source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots"
L="$B --codec-tokens 250 --turn-timeout-s 200 --concurrency 32"
date -u +%T; $L --out $OUT/base > $OUT/base.log 2>&1; echo "base rc=$?"
date -u +%T; $L --stage-config .device/jobs.yaml --out $OUT/jobs > $OUT/jobs.log 2>&1; echo "jobs rc=$?"
date -u +%T; $L --stage-config .device/jobsu.yaml --out $OUT/jobsu > $OUT/jobsu.log 2>&1; echo "jobsu rc=$?"
date -u +%T; $B --codec-tokens 50 --turn-timeout-s 120 --concurrency 16,32 --stage-config .device/jobs.yaml --out $OUT/jobs1s > $OUT/jobs1s.log 2>&1; echo "jobs1s rc=$?"
date -u +%T
for x in base jobs jobsu jobs1s; do echo "== $x"; [ -f $OUT/$x/report.md ] || continue; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/$x/wait.md; grep users $OUT/$x/wait.md; grep -o '[0-9]* underruns ([0-9]* ms) of a' $OUT/$x.log | awk '{n+=$1; if($1>0)t++} END {print "engine underruns", n, "in", t, "responses"}'; done
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s19a.tgz base jobs jobsu jobs1s *.log && rm -rf base jobs jobsu jobs1s *.log
