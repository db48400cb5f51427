"""The ANNY body model in numpy and its per-person fit to 3D keypoints (docs/body.md)."""
