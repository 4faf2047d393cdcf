"""Regenerate the committed gRPC code from serving/api/knowledge_tracing.proto.

    python -m serving.api.codegen            # rewrite the committed files in place
    python -m serving.api.codegen --out DIR  # write them under DIR (the drift test diffs the two)

protoc runs with the repository root as its only include root (`-I <root>`), so the generated
`_pb2_grpc.py` imports `serving.api.knowledge_tracing_pb2`: an absolute import of this package that
resolves without any sys.path change. The proto package (`routerkt.v1`, what clients see on the
wire) is independent of the Python package the code lives in. grpcio-tools is a development
dependency; the gateway never imports this module.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]                    # the repository root
PROTO = Path("serving/api/knowledge_tracing.proto")  # relative to ROOT
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def generated_files(root: Path = ROOT) -> list[Path]:
    """Paths of the generated files under `root` (in the same package folder as the .proto)."""
    stem = PROTO.with_suffix("").name
    return [root / PROTO.parent / f"{stem}{suffix}" for suffix in GENERATED_SUFFIXES]


def generate(out_root: Path = ROOT) -> list[Path]:
    """Run protoc (grpc_tools) and write the generated files under `out_root`; returns their paths.

    Files are generated into a temporary folder first and moved into place one by one with
    os.replace, so a failed run leaves the previous files untouched."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    out_root = Path(out_root)
    with tempfile.TemporaryDirectory(prefix="routerkt-codegen-") as tmp:
        args = ["grpc_tools.protoc", f"-I{ROOT}", f"-I{well_known}", f"--python_out={tmp}",
                f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", str(ROOT / PROTO)]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code} for {PROTO}")
        written = []
        for made, target in zip(generated_files(Path(tmp)), generated_files(out_root)):
            target.parent.mkdir(parents=True, exist_ok=True)
            staged = target.with_name(f".{target.name}.tmp")
            staged.write_bytes(made.read_bytes())
            staged.replace(target)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.api.codegen", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT,
                        help="root folder to write serving/api/... under (default: the repository)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
