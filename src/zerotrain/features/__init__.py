"""Optional training features that attach to the engine through engine/hooks.py events.

`build_features(config)` turns the config blocks into EngineFeature objects; the engine only
calls their hooks and never names one.
"""

from __future__ import annotations

from ..errors import ConfigError


def build_features(config) -> list:
    for block in ("curriculum_learning", "progressive_layer_drop"):
        value = getattr(config, block, None)
        if value is not None and value.enabled:
            raise ConfigError(f"{block}: the block is valid but this version of zerotrain does not run it "
                              "yet; set \"enabled\": false")
    return []
