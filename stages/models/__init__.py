"""Each model's stage half, one package per model beside its device half (npu/models/<model>/,
which imports nothing of stages): `job` (its job and Inferred types), `runtime` (the infer
stage's Runtime its ModelSpec names), `post` (the stage that publishes it), `result` (what that
stage publishes)."""
