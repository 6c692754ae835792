"""Protocol concepts shared by every source and reader of agent traffic (capture, imports, client,
simulator, analysis, fixtures), each written once:

``status``: how a recorded exchange ends (a session's status and error, docs/protocol.md §2), and what
a status or an error code means (§7).
``kinds``: frame kind names and the predicates every kind test uses (heartbeats, end-stream, families).
``append_meta``: the facts of a BidiAppend's exchange kept on its frames (``frames.meta``).
``run_request``: model, conversation, state and prompt of a run's opening message.
``args``: tool-call argument accumulation (snapshots vs increments), McpArgs merging and values.
``stream_json``: the ``cursor-agent --output-format stream-json`` event model.
``matching``: which client message answers which server message (docs/protocol.md §4).
``routes``: which HTTP exchanges are agent traffic, and their transport (run, runsse, bidi_append, …).

It may import ``wire``, ``schema`` and ``decode``; nothing from capture, ingest, client, sim,
analysis, tui, mitmproxy or textual.
"""
