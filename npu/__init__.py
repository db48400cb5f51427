"""The device side: IRON bundles, bf16, the XRT device (pyxrt), the simulated NPU, ops and models.

Knows nothing of stages or queues.
"""
