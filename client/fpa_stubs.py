"""Imports the Python gRPC stubs of proto/ (fpa.v1 and grpc.health.v1).

The build writes them to build/proto/python; FPA_PROTO_PY names another folder. When neither
holds them, they are generated once with protoc and grpc_python_plugin (Debian's
protobuf-compiler and protobuf-compiler-grpc) into ~/.cache/fpa-serve.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(REPO, "proto")
PROTOS = ["fpa/v1/fpa.proto", "grpc_health/v1/health.proto"]


def _has_stubs(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, "fpa", "v1", "fpa_pb2_grpc.py"))


def _generate() -> str:
    digest = hashlib.sha256()
    for p in PROTOS:
        with open(os.path.join(PROTO_DIR, p), "rb") as f:
            digest.update(f.read())
    out = os.path.join(os.path.expanduser("~"), ".cache", "fpa-serve",
                       "proto-" + digest.hexdigest()[:12])
    if not _has_stubs(out):
        os.makedirs(out, exist_ok=True)
        subprocess.run(["protoc", "-I", PROTO_DIR, f"--python_out={out}",
                        f"--grpc_python_out={out}",
                        "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin", *PROTOS],
                       check=True)
    return out


def stubs_dir() -> str:
    for folder in (os.environ.get("FPA_PROTO_PY"), os.path.join(REPO, "build", "proto", "python")):
        if folder and _has_stubs(folder):
            return folder
    return _generate()


def load():
    """Returns (fpa_pb2, fpa_pb2_grpc, health_pb2, health_pb2_grpc)."""
    folder = stubs_dir()
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return tuple(importlib.import_module(m) for m in (
        "fpa.v1.fpa_pb2", "fpa.v1.fpa_pb2_grpc",
        "grpc_health.v1.health_pb2", "grpc_health.v1.health_pb2_grpc"))
