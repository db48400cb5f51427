"""CLIP in the stages: ClipJob / ClipInferred (`job`), ClipRuntime with its labels file
(`runtime`), the clip_labels stage (`post`) and ClipResult (`result`); the model itself is
npu/models/clip/."""
