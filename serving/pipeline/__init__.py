"""The serving pipeline: its parts' interfaces (parts.py), admission (admission.py) and PredictionService
(prediction.py) with the public steps Predict, Recommend, Mastery and explain compose (call, resolve,
complete_history, encode, infer, infer_outputs)."""
