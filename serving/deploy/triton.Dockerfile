# syntax=docker/dockerfile:1
# Triton Inference Server with the exported RouterKT model repository baked in.
# Build from the repository root (after `routerkt export` has filled model_repository/):
#   docker build -f serving/deploy/triton.Dockerfile -t routerkt-triton .
# The project's bundled server is Triton 2.51 (nvidia-pytriton 0.7.0) = NGC release 24.10.
# config.pbtxt of a python-backend export runs export/triton_python_model/model.py, which needs
# numpy and onnxruntime in the image's system Python, the one its python backend stub embeds
# (onnxruntime 1.23.2: the newest release with wheels for Python 3.10 as well as 3.12). Exports
# with `--backend onnxruntime` or tensorrt use Triton's native backends instead.
ARG TRITON_RELEASE=24.10
FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3
# (PIP_BREAK_SYSTEM_PACKAGES: needed where the base marks its Python externally managed; ignored elsewhere)
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir numpy==1.26.4 onnxruntime==1.23.2
COPY model_repository/ /models/
# byte-compile now: the Python stub would otherwise write __pycache__ into the version folders
RUN python3 -m compileall -q /models
# HTTP/REST (KServe v2, /v2/health/*), gRPC, Prometheus metrics
EXPOSE 8000 8001 8002
# The flags of serving/tritonserver/command.py (explicit model control: the gateway loads and reloads
# models through the model-control API), listening on every address of the container.
CMD ["tritonserver", "--model-repository=/models", "--http-port=8000", "--grpc-port=8001", \
     "--metrics-port=8002", "--model-control-mode=explicit", "--load-model=*", \
     "--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0", \
     "--metrics-config", "summary_latencies=true", "--exit-timeout-secs=10", \
     "--disable-auto-complete-config"]
