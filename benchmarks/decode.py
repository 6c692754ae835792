"""Decode throughput: envelope parse + classify + summary on a mixed server corpus.

Baselines measured in the same run on the same frames: the raw generated class
``AgentServerMessage.FromString`` (upb) and blackboxprotobuf's schemaless ``decode_message``.

    python benchmarks/decode.py [--frames N] [--repeat R] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

import blackboxprotobuf
from goals import goal

from workbench.decode.classify import SERVER_MSG, Decoder
from workbench.schema import pb
from workbench.wire.envelope import encode

_WORDS = ("the", "agent", "reads", "files", "and", "writes", "code", "ünïcode", "tests", "pass", "→", "ok")


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _blob(rng: random.Random) -> bytes:
    size = rng.randint(2_000, 20_000)
    role = rng.choice(("system", "user", "assistant", "tool"))
    body = _text(rng, size // 5)[: size - 40]
    return json.dumps({"role": role, "content": body}).encode()


def build_corpus(n: int, seed: int = 7) -> list[bytes]:
    """Serialized AgentServerMessages in the mix the issue asks for."""
    rng = random.Random(seed)
    U, S = pb.InteractionUpdate, pb.AgentServerMessage
    out: list[bytes] = []
    cum = ""
    for i in range(n):
        r = rng.random()
        if r < 0.60:  # token/text deltas
            if rng.random() < 0.8:
                m = S(interaction_update=U(text_delta=pb.TextDelta(text=_text(rng, rng.randint(1, 6)))))
            else:
                m = S(interaction_update=U(token_delta=pb.TokenDelta(tokens=rng.randint(1, 50))))
        elif r < 0.70:
            m = S(interaction_update=U(heartbeat=pb.Heartbeat()))
        elif r < 0.80:
            data = _blob(rng)
            m = S(kv_server_message=pb.KvServerMessage(
                id=i, set_blob_args=pb.SetBlobArgs(blob_id=rng.randbytes(32), blob_data=data)))
        elif r < 0.90:
            call = f"toolu_{i // 20:06d}"
            if rng.random() < 0.6:
                cum += _text(rng, 3)
                m = S(interaction_update=U(partial_tool_call=pb.PartialToolCall(
                    call_id=call, args_text_delta='{"command": "' + cum[-300:], model_call_id="mc1")))
            else:
                m = S(interaction_update=U(tool_call_delta=pb.ToolCallDeltaUpdate(
                    call_id=call, tool_call_delta=pb.ToolCallDelta(shell_tool_call_delta=pb.ShellToolCallDelta(
                        stdout=pb.ShellToolCallStdoutDelta(content=_text(rng, 8)))))))
        else:
            ex = pb.ExecServerMessage(id=i, exec_id=f"exec-{i}")
            c = rng.randrange(4)
            if c == 0:
                ex.shell_args.CopyFrom(pb.ShellArgs(command="ls -la " + _text(rng, 2), working_directory="/w",
                                                    tool_call_id=f"toolu_{i}"))
            elif c == 1:
                ex.read_args.CopyFrom(pb.ReadArgs(path="/w/src/main.py", tool_call_id=f"toolu_{i}"))
            elif c == 2:
                ex.write_args.CopyFrom(pb.WriteArgs(path="/w/out.txt", file_text=_text(rng, 40)))
            else:
                ex.mcp_args.CopyFrom(pb.McpArgs(name="github___search", args={
                    "q": pb.Value(string_value=_text(rng, 3)).SerializeToString()}))
            m = S(exec_server_message=ex)
        out.append(m.SerializeToString())
    return out


def _best(fn: Callable[[], int], repeat: int) -> float:
    """Median seconds of ``repeat`` runs (fn returns a count used as a sanity check)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cpu(fn: Callable[[], int]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--chunk", type=int, default=16_384, help="bytes per feed() call (like h2 DATA frames)")
    args = ap.parse_args(argv)

    payloads = build_corpus(args.frames, args.seed)
    stream = b"".join(encode(p) for p in payloads)
    chunks = [stream[i : i + args.chunk] for i in range(0, len(stream), args.chunk)]
    n = len(payloads)
    mb = len(stream) / 1e6
    dec = Decoder()
    cls = dec.schema.message_class(SERVER_MSG)

    def workbench() -> int:
        sd = dec.stream("run", "server")
        got = 0
        for c in chunks:
            got += len(sd.feed(c))
        got += len(sd.close())
        assert got == n, got
        return got

    def raw() -> int:
        fs = cls.FromString
        for p in payloads:
            fs(p)
        return n

    bb_n = min(n, 2_000)  # blackboxprotobuf is ~100x slower; time a slice and scale
    bb_payloads = payloads[:bb_n]

    def bbpb() -> int:
        dm = blackboxprotobuf.decode_message
        for p in bb_payloads:
            dm(p)
        return bb_n

    kinds: dict[str, int] = {}
    for f in dec.decode_body(stream, "run", "server"):
        kinds[f.kind] = kinds.get(f.kind, 0) + 1

    # Interleaved pairs, each timed in CPU seconds of this (single-threaded) process: on a shared
    # machine the load moves between two back-to-back blocks of runs, less within a pair.
    pairs = [(_cpu(workbench), _cpu(raw)) for _ in range(args.repeat)]
    t_wb = statistics.median(p[0] for p in pairs)
    t_raw = statistics.median(p[1] for p in pairs)
    ratios = sorted(r / w for w, r in pairs)
    t_bb = _best(bbpb, max(1, args.repeat // 2)) * n / bb_n
    rows = [
        ("workbench stream decode+classify+summary", t_wb),
        ("raw AgentServerMessage.FromString", t_raw),
        ("blackboxprotobuf decode_message", t_bb),
    ]
    print(f"corpus: {n} frames, {mb:.1f} MB enveloped, {len(chunks)} chunks of {args.chunk} B, "
          f"python {sys.version.split()[0]}")
    print("mix: " + ", ".join(f"{k} {v * 100 / n:.0f}%" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    print()
    print(f"{'path':44} {'frames/s':>12} {'MB/s':>9} {'vs raw':>8} {'vs bbpb':>8}")
    for name, t in rows:
        print(f"{name:44} {n / t:12,.0f} {mb / t:9.1f} {t_raw / t:7.2f}x {t_bb / t:7.1f}x")
    ratio = statistics.median(ratios)
    print()
    print(f"ratio per interleaved pair, min/median/max of {len(ratios)}: "
          f"{ratios[0]:.3f}/{ratio:.3f}/{ratios[-1]:.3f} (load average {os.getloadavg()[0]:.2f})")
    print(goal("decode").line(ratio))
    print(yardstick_line())
    return 0


def yardstick_line() -> str:
    from yardstick import measure  # the machine's yardstick (benchmarks/yardstick.py), run after the figures

    return measure().line()


if __name__ == "__main__":
    sys.exit(main())
