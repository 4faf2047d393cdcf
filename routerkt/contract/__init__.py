"""The torch-free contract at the bottom of the project: what training, export and serving agree on.

- signature.py    named graphs (tensor names, dtypes, shapes), padding constants, artifact file names
- vocab.py        raw ids -> model ids (vocab.json), VocabError
- model_info.py   ModelInfo, the model_info.json schema (written by export, read by serving)
- repository.py   reading the Triton model repository: models, versions, info, vocab, config shape
- rollout_versions.py  the versions a rollout policy file names (never pruned by a publisher)

It imports nothing of training, export, serving or loadtest (import-linter checks it).
"""
