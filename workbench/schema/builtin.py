"""Where the built-in overlay's .proto files are: constants that load nothing (the loader compiles
them; the analysis stamp hashes them)."""

from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent / "proto"
BUILTIN_FILES = ("agent/v1/agent.proto", "aiserver/v1/aiserver.proto")
