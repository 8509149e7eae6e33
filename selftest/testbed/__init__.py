"""gpuhealth's own multi-host test bed (see bedlib): ``up(n) -> Bed`` and ``down()``."""

from .bedlib import Bed, BedError, Node, down, up

__all__ = ["Bed", "BedError", "Node", "down", "up"]
