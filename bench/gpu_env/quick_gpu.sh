#!/usr/bin/env bash
# Issue 53 item 5 (the standing GPU issue's item 2): configs/multi30k_quick.yaml end to end through
# run_pipeline.py — Ray started inside the run, teachers, distillation, REDER, evaluation on all of test 2016 —
# in ONE device call of at most 10 minutes: unpacking the environment, then the pipeline under its own limit
# (default 550 s, so that the environment's ~40 s and the summary fit in the call's 600; the recipe plans
# ~505 s and its budget.max_time is 530), then the summary against the
# issue's targets (bench/pipeline_summary.py). Everything it needs comes back under $OUT: pipeline.log,
# summary.txt / summary.json, results.tar.gz (results.json, every manifest, the histories, reports and
# training curves, mlflow.db).
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
work=${QUICK_WORKDIR:-/tmp/m30kq}
limit=${QUICK_LIMIT_S:-550}
started=$(date +%s.%N)
overrides=(workdir=$work)
if [ "${1:-}" = --rehearse ]; then
  shift
  python=${PYTHON:-$root/.venv/bin/python}
  limit=${QUICK_LIMIT_S:-600}
  overrides+=(data.local_dir=$root/../shared/data/multi30k data.limit=1500 model.vocab_size=2000
              model.d_model=64 model.ffn_dim=128 model.layers_per_end=1
              teacher.model.d_model=64 teacher.model.ffn_dim=128 teacher.model.encoder_layers=1
              teacher.model.decoder_layers=1 teacher.train.use_gpu=false teacher.train.cpus_per_worker=1
              teacher.train.max_time=25 teacher.train.max_tokens=4096 teacher.train.validate_every=1000
              train.use_gpu=false train.cpus_per_worker=1 train.max_time=25 train.max_tokens=4096
              train.validate_every=1000 distill.use_gpu=false
              budget.max_time=420 budget.reserve=200)
else
  python=python3
  bash bench/gpu_env/unpack.sh > /tmp/env.sh && . /tmp/env.sh || exit 1
  export PYTHONPATH=$root:${PYTHONPATH:-} RAY_AUTH_MODE=disabled
  overrides+=(data.local_dir=$root/bench/gpu_env/data/multi30k)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/pipeline.log"
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

( cd "$work" && tar czf "$out/results.tar.gz" --ignore-failed-read mlflow.db last_run.json config.yaml */manifest.json \
    evaluate-*/results.json train-*/history.json train-*/report.json train-*/training.png teacher-*/report.json \
    teacher-*/*/history.json teacher-*/*/training.png distill-*/report.json ) 2>/dev/null
if [ -d "$work" ]; then  # a run stopped at its limit too: the stages it finished
  timeout 30 "$python" -m bench.pipeline_summary --workdir "$work" --wall "$wall" --out "$out/summary.json" \
    > "$out/summary.txt" 2>&1
  head -20 "$out/summary.txt"
fi
echo "files in $out: $(ls "$out" | tr '\n' ' ')"
exit $code
