"""Face and person detectors for the detect stage: CPU, offline, pluggable.

Each detector returns plain arrays in image pixels (boxes xywh, scores, keypoints), so the
detect stage and the aligner need not know which model found a face.
"""
