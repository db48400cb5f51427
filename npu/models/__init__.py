"""Model forwards (Sapiens2-Pose, AdaFace, CLIP) over the op interface of npu.ops."""
