"""Small built-in models for the demo, the tests and the benchmarks."""

from .gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
