"""DeepSpeed's `engine.offload_states()` / `engine.reload_states()`: the engine's ZeRO states
to host memory between steps and back. What moves, when and what is refused is the
strategy's (zero/offload/states.py); the engine only hands it its optimizer, model and
zero_optimization block."""

from __future__ import annotations


class StateOffload:
    """Mixed into the engine `initialize` returns."""

    def offload_states(self, include=None, device="cpu", pin_memory: bool = True, non_blocking: bool = False) -> None:
        """Move the states in `include` (OffloadStateTypeEnum members or their names; None:
        all) to `device` (OffloadDeviceEnum.cpu), pinned with a GPU and `pin_memory`."""
        mover = self._state_mover()
        mover.offload(include, device, pin_memory, non_blocking)
        self.blocked_calls = mover.blocked_calls()  # until reload_states

    def reload_states(self, non_blocking: bool = False) -> None:
        """Every state offload_states moved, back to the device it came from."""
        self._state_mover().reload(non_blocking)
        self.blocked_calls = {}

    def _state_mover(self):
        if "_moved_states" not in self.__dict__:  # plain attribute: nn.Module's setattr would register nothing
            self.__dict__["_moved_states"] = self.strategy.state_mover(self.optimizer, self.module,
                                                                       self.config.zero_optimization)
        return self.__dict__["_moved_states"]
