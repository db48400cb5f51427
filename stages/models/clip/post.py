"""The clip_labels stage: CLIP's image embeddings -> ClipResults, label probabilities from the
text embeddings the infer stage attached (npu.models.clip.post)."""

from __future__ import annotations

from npu.models.clip.post import ZeroShotError, label_probabilities
from pipeline.graph import MapStage, StageOptions
from stages.jobs import Inferred
from stages.models.clip.job import ClipInferred, ClipJob
from stages.models.clip.result import ClipResult
from stages.postprocess import PostprocessError, result_fields, xyxy


class ClipLabelsOptions(StageOptions):
    pass


class ClipLabels(MapStage[ClipLabelsOptions]):
    """Inferred CLIP image embeddings -> ClipResult: label probabilities from the text
    embeddings and logit scale the infer stage attached (Inferred.extra)."""

    kind = "clip_labels"
    accepts = (ClipInferred,)
    Options = ClipLabelsOptions

    def process(self, item: Inferred) -> list[ClipResult]:
        job = item.job
        if not isinstance(job, ClipJob):
            return []
        where = f"camera {job.camera!r} #{job.seq}"
        missing = [k for k in ("labels", "text_embeds", "logit_scale") if k not in item.extra]
        if missing:
            raise PostprocessError(f"{where}: CLIP output lacks {', '.join(missing)}")
        labels = tuple(item.extra["labels"])
        try:
            probs = label_probabilities(
                item.output, item.extra["text_embeds"], item.extra["logit_scale"]
            )
        except ZeroShotError as exc:
            raise PostprocessError(f"{where}: {exc}") from exc
        if len(labels) != len(probs):
            raise PostprocessError(
                f"{where}: {len(labels)} labels but {len(probs)} text embeddings"
            )
        return [
            ClipResult(
                **result_fields(item),
                labels=labels,
                probabilities=probs,
                box=xyxy(job.box_xywh),
                track_id=job.track_id,
            )
        ]
