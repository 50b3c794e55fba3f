"""Mixed-precision helpers: fp16 loss scaling."""

from zerotrain.precision.loss_scaler import DynamicLossScaler, StaticLossScaler, build_loss_scaler

__all__ = ["DynamicLossScaler", "StaticLossScaler", "build_loss_scaler"]
