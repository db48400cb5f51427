"""Capacity planning for `npucam plan` (docs/operations.md, "Sizing a deployment"): probe
the cameras and measure the CPU side on this machine (probe), model the NPU side with the
calibrated NPU2 cost model and the inference stage's own scheduler (npu), and put both
together per resource (plan)."""
