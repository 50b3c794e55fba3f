"""Mixed-precision helpers: fp16 loss scaling, and its state readable on the optimizer."""

from .loss_scaler import DynamicLossScaler, StaticLossScaler, build_loss_scaler
from .optimizer_view import expose_loss_scale

__all__ = ["DynamicLossScaler", "StaticLossScaler", "build_loss_scaler", "expose_loss_scale"]
