"""What another local user can reach of a running `routerkt serve`: run as root, it loads what it needs,
drops to an unprivileged uid (no capabilities left), tries every way in and prints one JSON object.

    python tests/e2e/second_user_probe.py UID STATE_DIR GRPC_PORT HTTP_PORT SERVE_PID TRITON_PID LEARNER MODEL
"""
from __future__ import annotations

import encodings.idna  # noqa: F401  (loaded now: the interpreter's folder may be closed to the probe's uid)
import json
import os
import socket
import sqlite3
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from serving.api import knowledge_tracing_pb2 as pb  # noqa: E402
from serving.api import knowledge_tracing_pb2_grpc as pb_grpc  # noqa: E402

SHM_MARK = "triton_python_backend_shm_region"


def attempt(action) -> str:
    """'ok: ...' when `action` succeeded, else the exception's name."""
    try:
        return f"ok: {str(action())[:200]}"
    except Exception as exc:                     # the probe records every refusal as a name
        return type(exc).__name__


def read(path: str) -> str:
    with open(path, "rb") as handle:
        return f"{len(handle.read(1 << 20))} bytes"


def grpc_call(target: str, method: str, request) -> str:
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.KnowledgeTracingServiceStub(channel)
        try:
            reply = getattr(stub, method)(request, timeout=10)
        except grpc.RpcError as exc:
            return exc.code().name
        return f"OK {str(reply)[:200]!r}"


def http_call(url: str, method: str, body: dict) -> str:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method=method,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return f"{answer.status} {answer.read(200)!r}"
    except urllib.error.HTTPError as exc:
        return str(exc.code)


def probe(state: Path, grpc_port: int, http_port: int, serve_pid: int, triton_pid: int, learner: str,
          model: str) -> dict:
    out: dict[str, object] = {"uid": os.getuid(), "shadow": attempt(lambda: read("/etc/shadow"))}
    regions = [name for name in os.listdir("/dev/shm") if SHM_MARK in name]
    out["host_shm_regions"] = {name: attempt(lambda n=name: read(f"/dev/shm/{n}")) for name in regions}
    out["triton_root_shm"] = attempt(lambda: os.listdir(f"/proc/{triton_pid}/root/dev/shm"))
    out["state_dir_list"] = attempt(lambda: os.listdir(state))
    out["state_files"] = {name: attempt(lambda n=name: read(str(state / n)))
                          for name in ("sessions.sqlite3", "keys.jsonl", "admin.key", "store.secret", "triton.key",
                                       "rollout.json")}
    out["sqlite"] = attempt(lambda: sqlite3.connect(f"file:{state / 'sessions.sqlite3'}?mode=ro", uri=True)
                            .execute("select count(*) from sqlite_master").fetchall())
    address = next((a for a in read_cmdline(triton_pid) if a.startswith("--grpc-address=unix:")), None)
    out["triton_socket"] = "none" if address is None else attempt(lambda: connect_unix(address))
    target = f"127.0.0.1:{grpc_port}"
    out["grpc_predict_by_id"] = grpc_call(target, "Predict", pb.PredictRequest(
        model=model, learner_id=learner, candidates=[pb.Candidate(question_id=1)]))
    out["grpc_forget"] = grpc_call(target, "ForgetLearner", pb.ForgetLearnerRequest(learner_id=learner))
    base = f"http://127.0.0.1:{http_port}"
    out["http_predict_by_id"] = http_call(f"{base}/v1/predict", "POST", {
        "model": model, "learner_id": learner, "candidates": [{"question_id": 1}]})
    out["http_rollout_change"] = http_call(f"{base}/v1/rollout/{model}", "PUT", {"kind": "pinned", "version": 1})
    out["http_rollout_read"] = attempt(lambda: urllib.request.urlopen(f"{base}/v1/rollout", timeout=10).status)
    out["gateway_environ"] = attempt(lambda: read(f"/proc/{serve_pid}/environ"))
    out["gateway_cmdline"] = " ".join(read_cmdline(serve_pid))
    return out


def read_cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def connect_unix(address: str) -> str:
    path = address.split("unix:", 1)[1]
    folder = Path(path).parent
    name = next(n for n in os.listdir(folder) if n.startswith(Path(path).name))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(folder / name))
    return "connected"


def main() -> None:
    uid, state, grpc_port, http_port, serve_pid, triton_pid, learner, model = sys.argv[1:9]
    os.chdir("/")
    os.setgroups([])
    os.setgid(int(uid))
    os.setuid(int(uid))                          # from root to a uid of its own: no capabilities left
    print(json.dumps(probe(Path(state), int(grpc_port), int(http_port), int(serve_pid), int(triton_pid), learner,
                           model)))


if __name__ == "__main__":
    main()
