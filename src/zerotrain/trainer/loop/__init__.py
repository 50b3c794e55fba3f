"""The training loop: the Trainer (trainer), one micro-batch and what the loop counts (step),
evaluation (evaluate), and the run folder: overwrite checks, resume, rotation (run_folder)."""
