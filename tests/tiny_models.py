"""A tiny model of any preset with random weights, for the tests that compare its graphs (no training)."""
from __future__ import annotations

# the architecture of a tiny model: small enough to build and export in a test
TINY_ARCHITECTURE = {"d_model": 16, "n_blocks": 1, "n_heads": 4, "d_ff": 32, "final_fc": 32, "final_fc2": 16,
                     "lstm_hidden": 16}


def random_tiny_model(name: str, n_questions: int, n_skills: int, window: int, seed: int = 0, **opts):
    """Preset `name` with TINY_ARCHITECTURE, `window` as max_len and config `opts`, in eval mode, its
    weights drawn from torch.manual_seed(`seed`) and a non-zero question-difficulty term (the zero-init
    parameters drawn too)."""
    import torch

    from training.models.registry import build_model, preset_config, with_vocab

    torch.manual_seed(seed)
    cfg = with_vocab(preset_config(name), n_questions, n_skills)
    for key, value in {**TINY_ARCHITECTURE, "max_len": window, **opts}.items():
        setattr(cfg, key, value)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if any(pname.startswith(z) for z in model.zero_init):
                p.normal_(0.0, 0.7)
    return model
