"""Every tracked person's landmarks on every frame from MediaPipe's real-weight CPU models, and
occasional keyframes (Sapiens2's 308 keypoints) fused into them (docs/live-pose.md)."""
