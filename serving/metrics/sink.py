"""MetricsSink: the pipeline's PredictionSink (serving/pipeline/parts.py) that counts the probabilities
served per model and version."""
from __future__ import annotations

from serving.metrics import Metrics


class MetricsSink:
    """The pipeline's PredictionSink (serving/pipeline/parts.py): counts the probabilities served per model
    and version (routerkt_predictions_total; shadow scorings: routerkt_shadow_predictions_total)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def on_prediction(self, prediction) -> None:
        result = prediction.result
        counter = self.metrics.shadow_predictions if prediction.shadow else self.metrics.predictions
        for learner in result.learners:
            counter.labels(model=result.model, version=str(learner.version)).inc(int(learner.probabilities.shape[0]))
