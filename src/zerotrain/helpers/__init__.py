"""The helpers DeepSpeed scripts call around the engine, in zerotrain's terms: the device
(accelerator.py), command-line options (args.py), logging (logs.py), seeding and memory
reports (seed_memory.py), activation checkpointing, the FLOP count (flops.py), and the
table of DeepSpeed names zerotrain refuses (refusals.py). Scripts reach them under DeepSpeed's
module names (zerotrain.accelerator, .utils, .runtime.utils, .checkpointing, .profiling),
which are aliases of these files."""
