"""`routerkt export`: export a training run to ONNX and publish it as a new version in the Triton repository.

The python backend by default; onnxruntime / tensorrt configs for GPU hosts."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from export.triton_config import TritonModelOptions
from routerkt.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="training run directory (holds fold-*/meta.json)")
    p.add_argument("--repository", default="model_repository",
                   help="Triton model repository (default: model_repository)")
    p.add_argument("--name", default=None, help="model name in the repository (default: the run's preset)")
    p.add_argument("--version", type=int, default=None, help="version number (default: latest + 1)")
    p.add_argument("--backend", default="python", choices=["python", "onnxruntime", "tensorrt"],
                   help="python: Triton's python backend running onnxruntime on CPU (this machine); "
                        "onnxruntime / tensorrt: native backends of a GPU Triton")
    p.add_argument("--fp16", action="store_true",
                   help="onnxruntime backend: TensorRT accelerator in FP16; tensorrt: FP16 plan")
    p.add_argument("--quantize", default="none", choices=["none", "int8"],
                   help="int8: dynamic int8 quantization of the weights (about 1.2x faster here; "
                        "parity within 0.02)")
    p.add_argument("--fold", type=int, default=None, help="fold checkpoint to export (default: best validation AUC)")
    p.add_argument("--keep-versions", type=int, default=3,
                   help="newest versions kept on disk; older ones are deleted unless the rollout policy names them")
    p.add_argument("--policy-file", type=Path, default=Path(".routerkt") / "rollout.json",
                   help="the rollout policy file the gateway watches: the versions it names are never deleted "
                        "(default .routerkt/rollout.json)")
    p.add_argument("--max-batch-size", type=int, default=1024)
    p.add_argument("--instances", type=int, default=1, help="model instances")
    p.add_argument("--threads", type=int, default=TritonModelOptions.ort_intra_op_threads,
                   help="onnxruntime intra-op threads per instance (default chosen by `routerkt bench cost`)")
    p.add_argument("--queue-delay-us", type=int, default=TritonModelOptions.max_queue_delay_us,
                   help="dynamic batcher max queue delay (default chosen by `routerkt bench cost`)")
    p.add_argument("--preferred-batch-sizes", default="8,32,128", help="comma-separated")
    p.add_argument("--held-state-mib", type=int, default=TritonModelOptions.held_state_mib,
                   help="learner states the python model keeps for the gateway, in MiB (a step call then carries "
                        "a key, not the state; one instance only; 0: none; docs/operations.md, 'Held states')")
    p.add_argument("--no-warmup", action="store_true", help="no warm-up request at model load")
    p.add_argument("--fuse-attention", action="store_true",
                   help="rewrite each attention core into one onnxruntime MultiHeadAttention op where the attention "
                        "kind allows (faster at batch 32, slower at 512 here: docs/benchmarks.md, "
                        "'Fused attention'; off by default)")
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--no-step-graphs", dest="step_graphs", action="store_false",
                       help="leave out the step graphs (step_start / step_append / step_next.onnx: a learner's state "
                            "that the gateway appends answers to; docs/training.md, 'Step graphs'), written by default")
    steps.add_argument("--step-graphs", dest="step_graphs", action="store_true",
                       help="write the step graphs (the default; kept for scripts that name it)")
    p.set_defaults(step_graphs=True)


def run(args: argparse.Namespace) -> int:
    from export.exporter import export_run
    try:
        preferred = [int(x) for x in args.preferred_batch_sizes.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--preferred-batch-sizes {args.preferred_batch_sizes!r}: "
                        "expected integers like 8,32,128") from None
    options = TritonModelOptions(max_batch_size=args.max_batch_size, instance_count=args.instances,
                                 ort_intra_op_threads=args.threads, max_queue_delay_us=args.queue_delay_us,
                                 preferred_batch_sizes=preferred, warmup=not args.no_warmup, fp16=args.fp16,
                                 held_state_mib=args.held_state_mib)
    result = export_run(args.run, args.repository, name=args.name, version=args.version, backend=args.backend,
                        fold=args.fold, keep_versions=args.keep_versions, options=options, quantize=args.quantize,
                        fuse_attention=args.fuse_attention, policy_file=args.policy_file,
                        step_graphs=args.step_graphs)
    summary = {"model": result.name, "version": result.version, "repository": str(result.repository),
               "parity_max_abs_diff": result.parity_max_abs_diff, "files": result.files,
               "fused_attention_cores": result.fused_attention_cores}
    if args.step_graphs:
        summary["step_parity_max_abs_diff"] = result.step_parity_max_abs_diff
    print(json.dumps(summary))
    return 0
