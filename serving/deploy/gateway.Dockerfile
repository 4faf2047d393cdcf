# syntax=docker/dockerfile:1
# The RouterKT gateway (`routerkt serve`) in front of an external Triton and a Redis/Valkey store.
# Build from the repository root (after `routerkt export` has filled model_repository/):
#   docker build -f serving/deploy/gateway.Dockerfile -t routerkt-gateway .
# gateway.Dockerfile.dockerignore (next to this file) keeps the context to what is copied below.
# Only the `serve` extra is installed: serving needs no torch, and the build fails if torch shows up.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY routerkt/ routerkt/
COPY serving/ serving/
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install ".[serve]" \
 && /opt/venv/bin/python -c "import importlib.util, sys; sys.exit('torch must not be installed' if importlib.util.find_spec('torch') else 0)" \
 && /opt/venv/bin/routerkt serve --help > /dev/null

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent routerkt
COPY --from=build /opt/venv /opt/venv
# The gateway reads vocab.json, model_info.json and config.pbtxt of every version: the same export
# as the Triton image (build both images from one model_repository/).
COPY model_repository/ /models/
USER 10001
WORKDIR /tmp
# gRPC (KnowledgeTracingService, grpc.health.v1) and HTTP (/metrics, /livez, /readyz, /v1/*)
EXPOSE 50051 8080
ENTRYPOINT ["routerkt", "serve"]
# Defaults for docker compose (service names triton and redis); Kubernetes passes its own args.
# The store secret: ROUTERKT_STORE_SECRET or a file mounted at the --store-secret-file path; TLS, API
# keys, the store user's password, Triton's key and the CA of Triton's gRPC TLS (the gateway's own
# certificate is its client certificate there): compose secrets under /run/secrets (docs/security.md).
CMD ["--repository", "/models", "--host", "0.0.0.0", "--grpc-port", "50051", "--http-port", "8080", \
     "--triton-url", "triton:8001", "--store", "redis://routerkt@redis:6379/0", \
     "--store-secret-file", "/run/secrets/routerkt/store.secret", "--state-dir", "/tmp/routerkt", \
     "--store-password-file", "/run/secrets/redis_password", "--tls-cert", "/run/secrets/tls_cert", \
     "--tls-key", "/run/secrets/tls_key", "--api-keys", "/run/secrets/api_keys", \
     "--triton-key-file", "/run/secrets/triton_key", "--triton-tls-ca", "/run/secrets/tls_ca", \
     "--triton-tls-cert", "/run/secrets/tls_cert", "--triton-tls-key", "/run/secrets/tls_key", \
     "--log-format", "json"]
