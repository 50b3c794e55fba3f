"""What the distributed tests compare with: parameters of a world against a one-process reference."""

from __future__ import annotations


def assert_params_close(a: dict, b: dict, rtol: float = 1e-5) -> None:
    """Same names, and each tensor within `rtol` of the reference's norm (relative L2 difference)."""
    assert a.keys() == b.keys()
    for k in a:
        diff = (a[k] - b[k]).norm().item()
        scale = max(b[k].norm().item(), 1e-12)
        assert diff / scale <= rtol, f"{k}: relative difference {diff / scale:.2e}"
