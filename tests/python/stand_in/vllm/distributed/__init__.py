"""STAND-IN (see vllm/__init__.py): not vLLM."""
