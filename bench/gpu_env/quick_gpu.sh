#!/usr/bin/env bash
# The one-run GPU recipe: configs/multi30k_quick.yaml end to end through
# run_pipeline.py — Ray started inside the run, teachers, distillation, REDER, evaluation on all of test 2016 —
# in ONE device call of at most 10 minutes: unpacking the environment, then the pipeline under its own limit
# (default 550 s, so that the environment's ~40 s and the summary fit in the call's 600; the recipe plans
# ~505 s and its budget.max_time is 530), then the summary against the
# recipe's targets (bench/pipeline_summary.py). Everything it needs comes back under $OUT: pipeline.log,
# summary.txt / summary.json, results.tar.gz (results.json, the hypotheses and translations tables, every
# manifest, the histories, reports and training curves, mlflow.db), corpus.tar.gz (the finished data stages and the distilled corpus, for sweep_gpu.sh).
#
#   bash bench/gpu_env/quick_gpu.sh              on the GPU machine; carry bench/gpu_env/site.tar.xz and
#                                                bench/gpu_env/data (bench/gpu_env/pack.sh; the Multi30k files)
#   bash bench/gpu_env/quick_gpu.sh [KEY=VALUE ...]   overrides after the recipe's (and the rehearsal's)
#   bash bench/gpu_env/quick_gpu.sh --rehearse   here, on the CPU: the same command, limits and summary at a
#                                                tiny budget (small models, 1,500 training pairs, all of test)
# Environment: OUT (the device tool's; a temporary directory when unset), QUICK_LIMIT_S (the pipeline's limit),
# QUICK_WORKDIR (default /tmp/m30kq: a second call on a still-warm machine resumes what the first finished).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"  # a rehearsal's OUT may not exist yet (the device tool's does)
work=${QUICK_WORKDIR:-/tmp/m30kq}
limit=${QUICK_LIMIT_S:-550}
started=$(date +%s.%N)
overrides=(workdir=$work)
. "$here/where.sh"
if [ "${1:-}" = --rehearse ]; then
  shift
  limit=${QUICK_LIMIT_S:-600}
  rehearsal
  # what follows REDER's updates took ~34 s on the box of 2026-12-01 and 61-68 s on a slower one (2026-12-02)
  overrides+=(budget.max_time=240 budget.reserve=75)
else
  machine "$out/pipeline.log" || exit 1
fi
overrides+=("$@")  # the command line's own KEY=VALUE overrides come last (a shorter window's budget, say)
export PYTHONUNBUFFERED=1
echo "environment ready after $(python3 -c "print(round($(date +%s.%N) - $started, 1))") s" | tee -a "$out/pipeline.log"

pipeline_started=$(date +%s.%N)
timeout -s INT -k 20 "$limit" "$python" run_pipeline.py --config configs/multi30k_quick.yaml "${overrides[@]}" \
  >> "$out/pipeline.log" 2>&1
code=$?
wall=$(python3 -c "print(round($(date +%s.%N) - $pipeline_started, 1))")
echo "pipeline: exit $code after $wall s" | tee -a "$out/pipeline.log"

# The sweep's starting point (sweep_gpu.sh --corpus): the finished data stages and the distilled corpus, whose
# token ids match that spm directory; ≤ 16 MiB comes back from the machine.
( cd "$work" && finished=$(for d in ingest-* spm-* tokenize-* distill-*; do [ -f "$d/_SUCCESS" ] && echo "$d"; done) \
  && [ -n "$finished" ] && tar czf "$out/corpus.tar.gz" $finished \
  && echo "corpus.tar.gz: $(du -m "$out/corpus.tar.gz" | cut -f1) MiB of $(echo $finished)" | tee -a "$out/pipeline.log" ) 2>/dev/null
( cd "$work" && tar czf "$out/results.tar.gz" --ignore-failed-read mlflow.db last_run.json config.yaml */manifest.json \
    evaluate-*/results.json evaluate-*/*.txt evaluate-*/translations train-*/history.json train-*/report.json train-*/training.png teacher-*/report.json \
    teacher-*/*/history.json teacher-*/*/training.png distill-*/report.json ) 2>/dev/null
if [ -d "$work" ]; then  # a run stopped at its limit too: the stages it finished
  timeout 30 "$python" -m bench.pipeline_summary --workdir "$work" --wall "$wall" --out "$out/summary.json" \
    > "$out/summary.txt" 2>&1
  head -20 "$out/summary.txt"
fi
echo "files in $out: $(ls "$out" | tr '\n' ' ')"
exit $code
