"""Optimizer construction: config-named optimizers and client-supplied ones."""

from .factory import adapt_client_optimizer, build_optimizer

__all__ = ["adapt_client_optimizer", "build_optimizer"]
