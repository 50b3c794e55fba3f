"""What a run shows and writes: the start banner (banner), metrics.jsonl and TensorBoard
(metrics_log, tensorboard), the progress bar and summary table (progress), and the PNG of its
curves (plot)."""
