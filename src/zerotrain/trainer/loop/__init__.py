"""The training loop: the Trainer (trainer), one micro-batch and what the loop counts (step),
evaluation (evaluate), Ctrl-C and SIGTERM (interrupt), and the run folder: overwrite checks,
resume, rotation, shared or node-local storage (run_folder)."""
