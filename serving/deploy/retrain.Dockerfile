# syntax=docker/dockerfile:1
# `routerkt retrain` (the learning loop's offline half, docs/learning-loop.md): the train extra (torch,
# CPU build) and the serve extra (onnxruntime, the store clients, `routerkt sessions export` and
# `routerkt rollout`). Build from the repository root:
#   docker build -f serving/deploy/retrain.Dockerfile -t routerkt-retrain .
# It runs as the CronJob in k8s/retrain.yaml and the compose service `retrain` (profile retrain).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY routerkt/ routerkt/
COPY training/ training/
COPY export/ export/
COPY serving/ serving/
COPY loop/ loop/
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[train,serve]" \
 && /opt/venv/bin/routerkt retrain --help > /dev/null

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent routerkt
COPY --from=build /opt/venv /opt/venv
USER 10001
WORKDIR /tmp
ENTRYPOINT ["routerkt"]
CMD ["retrain", "--help"]
