"""Content redaction of what a report shows: structured tool arguments inside KV blobs, and
content a finding's message quotes."""

from __future__ import annotations

import json

from workbench.redact import redact_blob
from workbench.report.session import scrub_text


def test_structured_args_in_a_kv_blob_are_content() -> None:
    blob = json.dumps({"id": "m1", "role": "assistant", "content": [
        {"type": "tool-call", "toolCallId": "toolu_1", "toolName": "Shell",
         "args": {"command": "echo secret-plan", "env": ["A=b"]}, "result": {"stdout": "top secret"}}]}).encode()
    red = json.loads(redact_blob(blob))
    part = red["content"][0]
    # the structure a reader needs stays; every string of the arguments and the result is a marker
    assert part["type"] == "tool-call" and part["toolName"] == "Shell" and red["role"] == "assistant"
    assert part["args"]["command"].startswith("[redacted sha256:")
    assert part["args"]["env"][0].startswith("[redacted sha256:")
    assert part["result"]["stdout"].startswith("[redacted sha256:")
    assert b"secret" not in redact_blob(blob)


def test_scrub_text_hides_the_strings_redaction_hid() -> None:
    hidden = {"echo 'Hello from KV blob investigation'", "List the files here."}
    msg = ('blob 9d62… holds a tool-call Shell {"command": "echo \'Hello from KV blob investigation\'"} (not text); '
           "exec 2 (shell_args) at seq 14")
    out = scrub_text(msg, hidden)
    assert "Hello from KV" not in out and "[redacted sha256:" in out
    assert out.endswith("exec 2 (shell_args) at seq 14")  # structure words stay
    assert scrub_text("nothing to hide", hidden) == "nothing to hide"
