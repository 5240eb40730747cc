"""STAND-IN for vLLM, for ectransfer's tests only: NOT vLLM.

vLLM cannot be installed on the test machines. This package holds the smallest set of
vLLM names ectransfer.vllm imports or the tests drive (ECConnectorBase and its role and
metadata types, the connector factory's module-path branch, the TP group), each with
vLLM's real signatures, written for these tests. Everything else vLLM has is absent.
"""
