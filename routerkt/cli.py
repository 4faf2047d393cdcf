"""The `routerkt` console script: one dispatcher, subcommands imported lazily.

Each subcommand lives in the package that owns it and exposes `add_arguments(parser)` and
`run(args) -> int`. Only the chosen subcommand's module is imported, so `routerkt serve` and
`routerkt predict` never import torch. Errors are handled here, once for every subcommand: a bad
flag or a UserError is one line on stderr and exit code 2; `routerkt --version` prints the version
and the git commit.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from routerkt import build, memory
from routerkt.errors import UserError


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (no usage block), exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

# command -> (module, help). Command groups (GROUPS) nest: "bench <name>", "sessions <name>".
COMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("training.data.cli_synth", "write a synthetic learner dataset (canonical CSV)"),
    "train": ("training.cli.cli_train", "train a preset with K-fold cross-validation"),
    "evaluate": ("training.cli.cli_evaluate", "evaluate a run on a dataset and write plots"),
    "audit": ("training.cli.cli_audit",
              "leak audit of a trained run: perturbation probe, visible answers, shuffled-label control"),
    "validity": ("training.cli.cli_validity",
                 "validity of mastery and explanations against the truth of synthetic learners"),
    "reproduce": ("training.cli.cli_reproduce", "run the paper's comparison grid, resumable"),
    "export": ("export.cli_export", "export a run to ONNX and the Triton model repository"),
    "serve": ("serving.cli.cli_serve", "start tritonserver and the gRPC/HTTP gateway"),
    "predict": ("serving.cli.cli_predict", "call the gateway's Predict from the command line"),
    "rollout": ("serving.rollout.cli_rollout", "show and change the rollout policy (status, set, promote, rollback)"),
    "keys": ("serving.security.cli_keys", "issue, list and revoke the gateway's API keys"),
    "retrain": ("loop.cli_retrain",
                "retrain on the store's events, gate offline against the served version, publish as canary"),
}
BENCHES: dict[str, tuple[str, str]] = {
    "train": ("training.bench.bench_train", "training throughput per preset"),
    "step": ("training.bench.bench_step", "incremental learner state vs the full forward: step, predict_next, bytes"),
    "ceiling": ("loadtest.bench.ceiling",
                "Predict by learner_id on a cache hit vs a do-nothing server of the same service: the fraction"),
    "incremental": ("loadtest.bench.incremental",
                    "Predict by learner_id: state cache on vs off vs stateless, histories 10-300, C=1/20"),
    "throughput": ("loadtest.bench.throughput", "inference throughput: PyTorch vs onnxruntime vs Triton"),
    "load": ("loadtest.bench.load", "locust load test against the gateway"),
    "ranking": ("loadtest.bench.ranking", "history-once ranking vs one window per candidate, N candidates"),
    "fairness": ("loadtest.bench.fairness", "small calls alone and beside maximal PredictBatch calls"),
    "chaos": ("loadtest.bench.chaos", "load + maximal batch + Triton kill + version publish + SIGTERM, one run"),
    "outcomes": ("loadtest.bench.outcomes", "Predict / Observe latency with outcome tracking on and off"),
    "convert": ("loadtest.bench.convert",
                "the gateway's conversions: Interaction messages vs HistoryColumns, Triton request building"),
    "cost": ("loadtest.bench.cost",
             "one Predict's cost: in-process onnxruntime vs Triton vs gateway, Triton settings swept"),
    "replicas": ("loadtest.bench.replicas", "one gateway over 1 vs 2 Triton replicas: calls/s, p50 / p99"),
    "security": ("loadtest.bench.security",
                 "Predict with TLS + API keys vs plain, 1 and 32 callers: p50 / p99, calls/s"),
    "distributed": ("training.bench.bench_distributed", "data-parallel training throughput: 1 vs N processes (DDP, gloo)"),
    "retrain": ("loadtest.bench.retrain",
                "routerkt retrain's stages: export, training, evaluation per store size and kind"),
    "loop": ("loadtest.bench.loop",
             "a dataset replayed day by day through the gateway with a nightly retrain, vs a static v1"),
}
SESSIONS: dict[str, tuple[str, str]] = {
    "import": ("serving.sessions.cli_sessions_import", "bulk-load a canonical CSV into a session store"),
    "export": ("serving.sessions.cli_sessions_export", "stream a session store's events to the canonical CSV (bounded memory)"),
}
GROUPS: dict[str, dict[str, tuple[str, str]]] = {"bench": BENCHES, "sessions": SESSIONS}


def _maybe_reexec(argv: list[str]) -> None:
    """Training commands run with the memory policy of routerkt/memory.py."""
    command = " ".join(argv[:2]) if argv[:1] and argv[0] in GROUPS else (argv[0] if argv else "")
    if command in memory.TRAINING_COMMANDS:
        memory.run_like_training("routerkt.cli", argv)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    parser = OneLineParser(prog="routerkt", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"routerkt {build.version()} ({build.git_sha()})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    modules: dict[str, str] = {}
    for name, (module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
        modules[name] = module
    for group, members in GROUPS.items():
        group_parser = sub.add_parser(group, help=f"{group}: " + ", ".join(members))
        group_sub = group_parser.add_subparsers(dest=group, metavar=group.upper())
        group_sub.required = True
        for name, (module, help_text) in members.items():
            group_sub.add_parser(name, help=help_text, add_help=False)
            modules[f"{group} {name}"] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    """The console entry (argv None: sys.argv) may re-exec a training command with the malloc
    setting; a call with an explicit argv (tests, other programs) never replaces the process."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if from_command_line:
        _maybe_reexec(argv)
    parser, modules = build_parser()
    if not argv or argv[0] in ("-h", "--help", "--version"):
        if argv[:1] == ["--version"]:
            parser.parse_args(argv)                  # prints the version and exits 0
        parser.print_help()
        return 0 if argv else 2
    key = argv[0]
    rest = argv[1:]
    if key in GROUPS:
        if not rest or rest[0] not in GROUPS[key]:
            parser.parse_args(argv)  # prints usage and exits 2 (or help)
        key, rest = f"{key} {rest[0]}", rest[1:]
    if key not in modules:
        parser.parse_args(argv)
        return 2
    module = importlib.import_module(modules[key])
    sub = OneLineParser(prog=f"routerkt {key}", description=module.__doc__.splitlines()[0] if module.__doc__ else None)
    module.add_arguments(sub)
    args = sub.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"routerkt {key}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"routerkt {key}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
