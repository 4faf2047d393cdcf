"""Queries composed from the pipeline's public steps: Recommend (recommend.py), Mastery (mastery.py) and
attention explanations (explain.py)."""
