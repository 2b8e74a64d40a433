"""The pipeline's stages, one module (or package) each, in the order they run: ingest, spm, tokenize, teacher,
distill, train, cmlm, evaluate, and tune (a sweep of train). Each has a `build(run, tmp)`; the stage graph
(pipeline/graph.py) says what each hashes and reads."""
