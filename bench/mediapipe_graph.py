"""Print the graph mediapipe.solutions.holistic really runs (0.10.21, every subgraph expanded,
every option as the wheel sets it): the source of the ROI rules in docs/live-pose.md where the
.pbtxt files in google-ai-edge/mediapipe differ from the wheel (heatmap kernel, the one-euro
filter on the alignment points).

Runs ONLY in the reference venv: .venv-mediapipe/bin/python bench/mediapipe_graph.py > out.pbtxt
"""

from __future__ import annotations

from mediapipe.python.solutions import holistic


def main() -> None:
    solution = holistic.Holistic(
        static_image_mode=False, model_complexity=1, smooth_landmarks=False
    )
    print(solution._graph.text_config)  # the validated, expanded CalculatorGraphConfig
    solution.close()


if __name__ == "__main__":
    main()
