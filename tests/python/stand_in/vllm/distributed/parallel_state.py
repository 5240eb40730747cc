"""STAND-IN (see vllm/__init__.py): vLLM's get_tp_group(), nothing else.

A test worker process calls init_tp_group(rank, world_size) where vLLM would have
initialised torch.distributed; like vLLM's, get_tp_group() asserts when there is none.
"""

from dataclasses import dataclass


@dataclass
class GroupCoordinator:
    rank_in_group: int
    world_size: int


_TP = None


def init_tp_group(rank: int, world_size: int) -> None:
    global _TP
    _TP = GroupCoordinator(rank, world_size)


def get_tp_group() -> GroupCoordinator:
    assert _TP is not None, "tensor model parallel group is not initialized"
    return _TP
