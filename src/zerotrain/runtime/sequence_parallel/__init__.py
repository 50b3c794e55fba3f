"""`deepspeed.runtime.sequence_parallel` under zerotrain's name: ulysses_sp (ALST's names)."""
