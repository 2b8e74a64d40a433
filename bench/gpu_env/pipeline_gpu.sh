#!/usr/bin/env bash
# The pipeline itself through Ray on the lent GPU machine, in one `run` call (bench/README.md, "The GPU machine"):
#   first `pytest -m gpu` (RAY_GPU_TESTS=0: only the tests without Ray), then the default Multi30k pipeline
#   through Ray at a budget of the command line, then the same training budget through the training core alone
#   (bench.ray_overhead).
# Each part has its own time limit so that what ran comes back under $OUT:
#   pipeline.log, overhead.log, gpu_tests.log, results.tar.gz (evaluate's results.json, train's history.json,
#   report.json and training.png, every stage's manifest.json, mlflow.db, ray_overhead.json).
#
#   bash bench/gpu_env/pipeline_gpu.sh TEACHER_STEPS TRAIN_STEPS [PIPELINE_S OVERHEAD_S TESTS_S]
# The pipeline's workdir is /tmp/m30k on the device machine: a second call with the same arguments while the
# machine is still warm (30 s after the first returns) finds the stages the first finished and goes on from there
# (seen 2026-11-26: the second call skipped ingest, spm, tokenize and teacher). RAY_GPU_TESTS=0 skips the slow
# tests in such a second call. PARTS (default "tests pipeline overhead") names the parts this call runs, e.g.
# PARTS=pipeline for a first call that gives the pipeline the whole limit and PARTS="tests overhead" for the second.
# carry: bench/gpu_env/site.tar.xz and bench/gpu_env/data (bench/gpu_env/pack.sh; the Multi30k files).
set -u
teacher_steps=${1:?teacher steps}
train_steps=${2:?train steps}
pipeline_s=${3:-330}
overhead_s=${4:-110}
tests_s=${5:-100}
out=${OUT:?the device tool output folder}
work=/tmp/m30k
started=$(date +%s)
parts=" ${PARTS:-tests pipeline overhead} "

bash bench/gpu_env/unpack.sh > /tmp/env.sh && . /tmp/env.sh || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/pipeline.log"
echo "unpacked in $(( $(date +%s) - started )) s" | tee -a "$out/pipeline.log"

# The GPU tests that need no Ray first (seconds each; a failure's traceback is printed when its file ends), then
# the two Ray ones (about a minute each on the H200, 2026-11-26).
gpu_tests=(tests/pipeline/test_gpu.py tests/reder/test_autoregressive.py tests/reder/test_dag_triton.py)
if [[ $parts == *" tests "* ]]; then
timeout "$tests_s" python3 -m pytest -m "gpu and not slow" -q -rs -p no:cacheprovider "${gpu_tests[@]}" \
  > "$out/gpu_tests.log" 2>&1
echo "gpu tests (no Ray): exit $? after $(( $(date +%s) - started )) s" | tee -a "$out/gpu_tests.log"
if [ "${RAY_GPU_TESTS:-1}" = 1 ]; then
  timeout "$tests_s" python3 -m pytest -m "gpu and slow" -q -rs -p no:cacheprovider "${gpu_tests[@]}" \
    >> "$out/gpu_tests.log" 2>&1
  echo "gpu tests (Ray): exit $? after $(( $(date +%s) - started )) s" | tee -a "$out/gpu_tests.log"
fi
fi

overrides=(workdir=$work data.local_dir=$PWD/bench/gpu_env/data/multi30k
           teacher.train.max_steps=$teacher_steps teacher.train.validate_every=$(( teacher_steps / 2 ))
           train.max_steps=$train_steps train.validate_every=$(( train_steps / 2 )) evaluate.max_sentences=200)
[[ $parts == *" pipeline "* ]] && timeout -s INT -k 20 "$pipeline_s" python3 run_pipeline.py --config configs/multi30k.yaml "${overrides[@]}" \
  >> "$out/pipeline.log" 2>&1
echo "pipeline: exit $? after $(( $(date +%s) - started )) s" | tee -a "$out/pipeline.log"

[[ $parts == *" overhead "* ]] && timeout "$overhead_s" python3 -m bench.ray_overhead --workdir $work --config configs/multi30k.yaml \
  --out $work/ray_overhead.json "${overrides[@]}" > "$out/overhead.log" 2>&1
echo "overhead: exit $? after $(( $(date +%s) - started )) s" | tee -a "$out/overhead.log"

( cd $work && tar czf "$out/results.tar.gz" --ignore-failed-read ray_overhead.json mlflow.db */manifest.json \
    evaluate-*/results.json train-*/history.json train-*/report.json train-*/training.png ) 2>/dev/null

