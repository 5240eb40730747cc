"""STAND-IN (see vllm/__init__.py): the branch of vLLM's ECConnectorFactory that loads
an out-of-tree connector: the class named ec_connector in ec_connector_module_path."""

import importlib


class ECConnectorFactory:
    @classmethod
    def get_connector_class(cls, ec_transfer_config):
        name = ec_transfer_config.ec_connector
        path = ec_transfer_config.ec_connector_module_path
        if name is None or path is None:
            raise ValueError(f"Unsupported connector type: {name}")
        return getattr(importlib.import_module(path), name)

    @classmethod
    def create_connector(cls, config, role):
        return cls.get_connector_class(config.ec_transfer_config)(config, role)
