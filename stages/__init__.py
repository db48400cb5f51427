"""One module per pipeline stage: capture, detect (+ crops), align, infer, postprocess, publish."""
