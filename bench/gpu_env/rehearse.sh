# Sourced by quick_gpu.sh and sweep_gpu.sh with --rehearse: the CPU rehearsal's overrides of
# configs/multi30k_quick.yaml (small models, 1,500 training pairs, all of test), one list for both, so that a
# rehearsed quick run's stage directories are the ones a rehearsed sweep reuses.
rehearse_overrides=(data.local_dir=$root/../shared/data/multi30k data.limit=1500 model.vocab_size=2000
                    model.d_model=64 model.ffn_dim=128 model.layers_per_end=1
                    teacher.model.d_model=64 teacher.model.ffn_dim=128 teacher.model.encoder_layers=1
                    teacher.model.decoder_layers=1 teacher.train.use_gpu=false teacher.train.cpus_per_worker=1
                    teacher.train.max_time=25 teacher.train.max_tokens=4096 teacher.train.validate_every=1000
                    train.use_gpu=false train.cpus_per_worker=1 train.max_time=25 train.max_tokens=4096
                    train.validate_every=1000 distill.use_gpu=false)
