"""STAND-IN (see vllm/__init__.py): vLLM's ECConnectorBase interface, not its code.

The methods and signatures are those of vLLM's
vllm/distributed/ec_transfer/ec_connector/base.py (push-capable version: with
ensure_cache_available, receive_addresses and has_pending_push_work); the bodies are
the defaults an engine relies on (metadata binding) and nothing more.
"""

import enum
from abc import ABC, abstractmethod
from typing import Any


class ECConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class ECConnectorMetadata(ABC):  # noqa: B024
    pass


class ECConnectorWorkerMetadata(ABC):
    @abstractmethod
    def aggregate(self, other: "ECConnectorWorkerMetadata") -> "ECConnectorWorkerMetadata":
        ...


class ECConnectorBase(ABC):
    def __init__(self, vllm_config: Any, role: ECConnectorRole):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._role = role
        if vllm_config.ec_transfer_config is None:
            raise ValueError("ec_transfer_config must be set for ECConnectorBase")
        self._is_producer = vllm_config.ec_transfer_config.is_ec_producer
        self._is_consumer = vllm_config.ec_transfer_config.is_ec_consumer

    @property
    def role(self) -> ECConnectorRole:
        return self._role

    @property
    def is_producer(self) -> bool:
        return self._is_producer

    @property
    def is_consumer(self) -> bool:
        return self._is_consumer

    def shutdown(self) -> None:
        return None

    # worker side
    def bind_connector_metadata(self, connector_metadata: ECConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> ECConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def register_caches(self, ec_caches: dict) -> None:
        return None

    @abstractmethod
    def start_load_caches(self, encoder_cache: dict, **kwargs: Any) -> None:
        ...

    @abstractmethod
    def save_caches(self, encoder_cache: dict, mm_hash: str, **kwargs: Any) -> None:
        ...

    def get_finished(self, finished_req_ids: set) -> tuple:
        return None, None

    def build_connector_worker_meta(self):
        return None

    # scheduler side
    @abstractmethod
    def has_cache_item(self, identifier: str) -> bool:
        ...

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        return True

    @abstractmethod
    def update_state_after_alloc(self, request: Any, index: int):
        ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any) -> ECConnectorMetadata:
        ...

    def update_connector_output(self, connector_output: Any):
        return None

    def request_finished(self, request: Any) -> tuple:
        return False, None

    @classmethod
    def receive_addresses(cls, vllm_config: Any) -> list:
        return []

    def has_pending_push_work(self) -> bool:
        return False
