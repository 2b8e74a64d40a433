# Sourced by quick_gpu.sh and sweep_gpu.sh (after they set `root` and `overrides`): where the script runs, one
# definition for both, so that a rehearsed quick run's stage directories are the ones a rehearsed sweep reuses and
# both find the same carried files on the GPU machine. Each sets `python` and adds to `overrides`.

# Here, on the CPU: configs/multi30k_quick.yaml at a tiny budget (small models, 1,500 training pairs, all of test).
rehearsal() {
  python=${PYTHON:-$root/.venv/bin/python}
  overrides+=(data.local_dir=$root/../shared/data/multi30k data.limit=1500 model.vocab_size=2000
              model.d_model=64 model.ffn_dim=128 model.layers_per_end=1
              teacher.model.d_model=64 teacher.model.ffn_dim=128 teacher.model.encoder_layers=1
              teacher.model.decoder_layers=1 teacher.train.use_gpu=false teacher.train.cpus_per_worker=1
              teacher.train.max_time=25 teacher.train.max_tokens=4096 teacher.train.validate_every=1000
              train.use_gpu=false train.cpus_per_worker=1 train.max_tokens=4096
              train.validate_every=1000 distill.use_gpu=false)
}

# On the GPU machine: the carried environment (unpack.sh) on the path, the carried Multi30k files as the data and
# test 2017 flickr; the card's name into the log $1. Fails (status 1) where the environment cannot be unpacked.
machine() {
  python=python3
  bash "$root/bench/gpu_env/unpack.sh" > /tmp/env.sh && . /tmp/env.sh || return 1
  export PYTHONPATH=$root:${PYTHONPATH:-} RAY_AUTH_MODE=disabled
  local data=$root/bench/gpu_env/data/multi30k
  overrides+=(data.local_dir=$data
              "evaluate.test_sets={test_2017_flickr: {src: $data/test_2017_flickr.en, tgt: $data/test_2017_flickr.de}}")
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$1"
}
