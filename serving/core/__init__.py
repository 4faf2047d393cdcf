"""What every part of the gateway shares: the transport-independent calls (calls.py: queries and results
as plain dataclasses of numpy arrays), the model catalog read from the repository (catalog.py), the
validation of a query (validation.py), what an Encoder produces (encoded.py) and a learner's log revision
(revision.py)."""
