"""The public gRPC API, package `routerkt.v1` on the wire: knowledge_tracing.proto and the Python code
generated from it (committed; `python -m serving.api.codegen` regenerates it, a unit test diffs it)."""
