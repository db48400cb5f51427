"""AdaFace in the stages: FaceJob / FaceInferred (`job`), AdaFaceRuntime (`runtime`), the
face_match stage (`post`) and FaceResult (`result`); the model itself is npu/models/adaface/."""
