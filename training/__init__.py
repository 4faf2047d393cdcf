"""Training: the models and a K-fold run at the top, the rest in folders. Map of the folder:

    config.py            RunConfig (data, model, train) and its JSON; the presets live in models/registry.py
    training_run.py      one run end to end (data, folds, each fold, the metrics); launch.py starts it
    fold_training.py     one fold: the training loop; distributed.py its data-parallel collectives
    batching.py device.py checkpoint.py metrics.py plots.py   batches, device, checkpoints, metrics, PNGs
    models/              the backbones, attention variants, router, step and band paths (registry.py)
    data/                the canonical CSV, the folds and protocols, synthetic learners
    cli/                 the `routerkt train | evaluate | audit | reproduce | validity` commands
    bench/               training throughput, the step path, data-parallel speed-up, fidelity A/B
    paper/               the paper's grid (reproduce.py, variants.py) and RESULTS.md (results_report.py)
    eval/                leak audit, the served protocol, validity, attention analysis
"""
