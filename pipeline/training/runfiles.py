"""The names of the files a training run hands on, in one place for the code that writes them and the code that
reads them: a checkpoint's (`trainloop._save` writes it; `trainloop.load_state_dir` and
`raytrain.fit_and_average` read it), the Ray Train run directory's progress and placement files (rank 0 of
pipeline/training/trainloop.py writes them, the driver, pipeline/training/raytrain.py, reads them), and a training stage's output
(pipeline/stages/train.py, pipeline/stages/teacher.py). A checkpoint's state dict is named as a model directory's,
`reder.checkpoint.MODEL_FILE`."""

MODEL_DIR = "model"
HISTORY_FILE = "history.json"
TRAIN_STATE_FILE = "train_state.pt"
PROGRESS_FILE = "progress.json"  # rank 0's latest report, in the Ray Train run's directory: the driver's bar
WORKERS_FILE = "workers.json"  # where the worker group's ranks run (node, host), beside it
