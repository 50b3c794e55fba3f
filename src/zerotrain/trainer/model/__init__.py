"""The model of a run: presets and model folders in and out (build), LoRA adapters (lora),
gradient checkpointing."""
