"""Sapiens2-Pose in the stages: PoseJob / PoseInferred (`job`), Sapiens2Runtime (`runtime`), the
dark stage (`post`) and PoseResult (`result`); the model itself is npu/models/sapiens2/."""
