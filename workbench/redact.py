"""Redaction of secrets (always) and content (on request) in what the workbench stores.

Nothing here touches the wire: capture forwards bytes unchanged and only the stored copy passes
through these functions. A redacted value becomes ``[redacted sha256:<12 hex>]`` so equal values
still correlate (the same token in two sessions gets the same marker) without being readable.

Two levels:

- ``secrets`` (always on): credential headers (``SECRET_HEADERS``), model credentials in any
  ``credentials`` oneof (``ModelDetails`` / ``RequestedModel`` in ``run_request`` /
  ``prewarm_request`` and their subagent model lists; ``SubagentArgs`` the server sends with the
  user's own key), and whole payloads of RPCs that carry tokens or plaintext environments.
- ``content``: additionally prompts, rules, file contents, command lines and output, tool
  arguments and results, KV blobs (JSON prompt blobs keep their structure, their text becomes
  markers), and the model's text: every string/bytes field except the structure names
  (``STRUCTURE_FIELDS``: ids, names, paths, kinds), so newly typed fields start out hidden.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from workbench.decode.frame import Frame
from workbench.nesting import load_json
from workbench.protocol import kinds
from workbench.protocol.args import map_leaves
from workbench.wire.envelope import FLAG_COMPRESSED, encode, split_unary

if TYPE_CHECKING:
    from workbench.decode.classify import Decoder

LEVELS = ("secrets", "content")

SECRET_HEADERS = frozenset({
    "authorization", "proxy-authorization", "cookie", "set-cookie", "x-client-key", "x-cursor-checksum",
    "x-api-key", "api-key", "x-auth-token", "x-access-token", "x-session-token", "x-refresh-token",
    "x-cursor-custom-system-prompt", "x-amz-security-token",
})

# Payload types whose whole body is a credential or a plaintext environment (docs/protocol.md §1).
SECRET_MESSAGE_TYPES = frozenset({
    "aiserver.v1.McpOAuthStoredData", "aiserver.v1.GetMcpRefreshTokensResponse",
    "aiserver.v1.RefreshGithubAccessTokenRequest", "aiserver.v1.RefreshGithubAccessTokenResponse",
    "aiserver.v1.UpdateEnvironmentVariablesRequest", "aiserver.v1.ArtifactUploadInstruction",
})
# RPC method names that suggest credentials in either body: their payloads are stored as a marker.
SECRET_METHOD_WORDS = ("token", "auth", "credential", "secret", "environmentvariable", "login", "apikey")

_CREDENTIAL_ONEOF = "credentials"
_NOT_SECRET = frozenset({"region", "base_url", "deployment"})
_CLIENT_MSG = "agent.v1.AgentClientMessage"
_SERVER_MSG = "agent.v1.AgentServerMessage"
_BIDI_APPEND = "aiserver.v1.BidiAppendRequest"
_BIDI_POLL_RESP = "aiserver.v1.BidiPollResponse"

# Fields (string or bytes, or map values) holding user content, by field name across agent.v1.
CONTENT_FIELDS = frozenset({
    "text", "rich_text", "content", "contents", "stream_content", "stream_content_delta", "custom_system_prompt",
    "plan", "plan_file_content", "file_contents", "diff_string", "before_full_file_content",
    "after_full_file_content", "prompt", "command", "stdout", "stderr", "interleaved_output", "output_head",
    "output_tail", "data", "blob_data", "args_text_delta", "cloud_rule", "rules", "conversation_notes_listing",
    "shared_notes_listing", "user_intent_summary", "hooks_additional_context", "args", "result",
    "original_args", "selected_context", "summary", "message", "reason", "hook_message", "description",
    "query", "url", "pattern", "error_message", "model_visible_error",
})
# String/bytes fields kept in clear at the content level: ids, names, paths, kinds and statuses, what a
# diagnosis needs. Every other string or bytes field counts as content (``is_content_field``), so a
# field the overlay learns later is hidden until it is listed here. Names ending in ``_id``/``_ids``
# are kept too (call ids, blob ids, …).
STRUCTURE_FIELDS = frozenset({
    # names of the overlay before it typed the newer messages (their behaviour is unchanged)
    "abs_path", "actual_type", "additional_info", "agent_conversation_notes_folder", "agent_shared_notes_folder",
    "agent_transcripts_folder", "agent_type", "aliases", "artifacts_folder", "available_servers",
    "available_tools", "base_url", "commit_attribution_message", "content_type", "cwd", "definition_path",
    "deleted_file", "deployment", "dependencies", "directory", "display_model_id", "display_name",
    "display_name_short", "encoding_hint", "error", "error_code", "file", "file_path", "file_states", "files",
    "folder_path", "glob", "glob_pattern", "ignore", "input_schema_json", "mime_type", "model", "name",
    "operation", "os_version", "output_mode", "path", "plan_file_uri", "pr_attribution_message",
    "previous_workspace_uris", "project_folder", "provider_identifier", "read_only_pinned_tree_sha",
    "read_only_plugin_cache_root", "read_paths", "region", "resume", "root_prompt_messages_json", "server_name",
    "server_identifier", "shell", "signal", "sort", "stack_trace", "steps", "summary_archive", "summary_archives",
    "target_directory", "terminals_folder", "time_zone", "todos", "tool_name", "trace_state", "turns",
    "turns_old", "type", "type_url", "working_directory", "workspace_paths", "workspace_project_dir",
    # structure in the messages typed from the public extractions
    "additional_readonly_paths", "additional_readwrite_paths", "attachments", "base_branch", "base_ref",
    "branch_name", "canonical_model_name", "category", "commit", "conflict_abs_path", "conflict_rel_path",
    "content_path", "conversation_started_time_zone", "current_branch", "date", "debug_output_dir",
    "dev_raw_model_slug", "disabled_environments", "download_path", "environments", "failure_type", "file_paths",
    "full_output_path", "full_path", "ghe_application", "git_branch", "harness", "head_sha", "hook_event_name",
    "journal_epoch", "kind", "level", "log_format", "log_path", "marketplace", "mcp_servers", "modifier_keys",
    "operator", "original_abs_path", "original_rel_path", "output_file_path", "output_path", "owner", "paths",
    "permission", "plan_file_path", "plan_uri", "plugin", "pr_url", "process_working_directory", "ref",
    "relative_path", "relative_workspace_path", "remote_branch", "remote_names", "remote_url", "remote_urls",
    "repo", "repo_name", "repo_owner", "repo_path", "repo_url", "role", "screenshot_path", "server",
    "server_identifiers", "severity", "sha", "source", "source_path", "source_type", "status", "subagent_model",
    "subagent_type", "subagent_type_name", "target_directories", "target_node_type", "target_paths", "tools",
    "transcript_path", "trigger", "truncated_by", "uri", "uuid", "workspace_uri",
})


def is_content_field(name: str) -> bool:
    """Whether a string/bytes field (or a map's scalar values) holds content, by field name."""
    if name in CONTENT_FIELDS:
        return True
    return name not in STRUCTURE_FIELDS and not name.endswith(("_id", "_ids"))


# JSON keys whose string values are content inside prompt/message JSON blobs.
_JSON_CONTENT_KEYS = frozenset({"content", "text", "arguments", "args", "result", "output", "input", "reasoning"})
# ... of which these hold a tool's arguments or its result: every string under them is content,
# however deep (``"args": {"command": "…"}``); under the others the structure is walked.
_JSON_ARGS_KEYS = frozenset({"arguments", "args", "result", "output", "input"})


def short_hash(data: str | bytes) -> str:
    """First 12 hex digits of SHA-256: enough to correlate, useless to recover the value."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:12]


def marker(data: str | bytes) -> str:
    return f"[redacted sha256:{short_hash(data)}]"


_MARKER = re.compile(r"\[redacted sha256:[0-9a-f]{12}\]")


def is_marker(value: str) -> bool:
    """Is ``value`` exactly a marker (redacting it again must leave it as it is: the write gate
    redacts what a source may have redacted already)."""
    return _MARKER.fullmatch(value) is not None


def bearer_hash(authorization: str | None) -> str | None:
    """``auth_hash`` for a session: the short hash of the token without its ``Bearer`` prefix."""
    if not authorization:
        return None
    token = authorization.split(None, 1)[1] if authorization.lower().startswith("bearer ") else authorization
    return short_hash(token.strip())


def is_secret_header(name: str) -> bool:
    n = name.lower()
    return n in SECRET_HEADERS or n.endswith(("-token", "-secret", "-api-key", "-password"))


def redact_headers(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Header pairs with every secret value replaced by its marker (names and order kept)."""
    out: list[tuple[str, str]] = []
    for name, value in items:
        if is_secret_header(name) and not is_marker(value) and not is_marker(value[7:]):
            if name.lower() == "authorization" and value.lower().startswith("bearer "):
                value = "Bearer " + marker(value[7:].strip())
            else:
                value = marker(value)
        out.append((name, value))
    return out


def secret_method(path: str | None) -> bool:
    """True for RPCs whose bodies are credentials (``/aiserver.v1.X/RefreshGithubAccessToken``)."""
    if not path:
        return False
    method = path.rsplit("/", 1)[-1].lower()
    return any(w in method for w in SECRET_METHOD_WORDS)


# payloads --------------------------------------------------------------------------------------

def _class(msg_type: str) -> type[Message] | None:
    # deferred: the decoder brings the schema (≈ 20 ms); readers import the store, hence this
    # module, and only a frame that may carry a credential gets here
    from workbench.decode.classify import default_decoder

    schema = default_decoder().schema
    if not schema.has(msg_type):
        return None
    return schema.message_class(msg_type)


def _scrub_credentials(msg: Message) -> bool:
    """Replace every string in any credentials oneof below ``msg`` by a marker.

    The holders are ModelDetails / RequestedModel (run_request, prewarm_request, the subagent model
    lists) and SubagentArgs / SubagentCredentials (the server hands a subagent the user's own key).
    """
    changed = False
    desc = msg.DESCRIPTOR
    if _CREDENTIAL_ONEOF in desc.oneofs_by_name:
        which = msg.WhichOneof(_CREDENTIAL_ONEOF)
        if which is not None:
            cred = getattr(msg, which)
            for fd, value in cred.ListFields():
                if fd.type == FieldDescriptor.TYPE_STRING and value and fd.name not in _NOT_SECRET \
                        and not is_marker(value):
                    setattr(cred, fd.name, marker(value))
                    changed = True
    for fd, value in msg.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if fd.containing_oneof is not None and fd.containing_oneof.name == _CREDENTIAL_ONEOF:
            continue  # done above
        for v in submessages(fd, value):
            changed |= _scrub_credentials(v)
    return changed


def map_value_field(fd: FieldDescriptor) -> FieldDescriptor | None:
    """The ``value`` field of a map field's entries; None when ``fd`` is not a map."""
    mt = fd.message_type
    return mt.fields_by_name["value"] if mt is not None and mt.GetOptions().map_entry else None


def submessages(fd: FieldDescriptor, value: Any) -> Iterable[Message]:
    """The messages a set message-typed field holds: the values of a map of messages (none for a
    map of scalars), the items of a repeated field, or the one message."""
    vfd = map_value_field(fd)
    if vfd is not None:
        return value.values() if vfd.type == FieldDescriptor.TYPE_MESSAGE else ()
    return value if fd.is_repeated else (value,)


def may_carry_credentials(payload: bytes, msg_type: str) -> bool:
    """Cheap pre-check on the capture path: run_request (1) / prewarm_request (8) from the client,
    or an exec_server_message (2) holding subagent_args (field 28, tag ``e2 01``) from the server;
    any other message whose type can reach a ``credentials`` oneof (a unary call carrying
    ModelDetails, say) is parsed and looked in."""
    if msg_type == _CLIENT_MSG:
        return payload[:1] in (b"\x0a", b"\x42")
    if msg_type == _SERVER_MSG:
        return payload[:1] == b"\x12" and b"\xe2\x01" in payload
    cls = _class(msg_type)
    return cls is not None and _reaches_credentials(cls.DESCRIPTOR)


_REACHES: dict[str, bool] = {}


def _reaches_credentials(desc: Any) -> bool:
    """Whether a message of this type can hold a ``credentials`` oneof at any depth (a walk of the
    types it can reach, memoised per type asked about)."""
    name = desc.full_name
    if name not in _REACHES:
        seen: set[str] = set()
        todo = [desc]
        found = False
        while todo and not found:
            d = todo.pop()
            if d.full_name in seen:
                continue
            seen.add(d.full_name)
            found = _CREDENTIAL_ONEOF in d.oneofs_by_name
            todo += [fd.message_type for fd in d.fields if fd.type == FieldDescriptor.TYPE_MESSAGE]
        _REACHES[name] = found
    return _REACHES[name]


def redact_untyped(payload: bytes) -> bytes:
    """A payload of no known type (an RPC path the schema does not name) with credentials hidden:
    read as each agent message that carries them, the first reading that finds one wins. Returns
    ``payload`` itself when none does."""
    for msg_type in (_CLIENT_MSG, _SERVER_MSG):
        if not may_carry_credentials(payload, msg_type):
            continue
        cls = _class(msg_type)
        if cls is None:
            continue
        try:
            msg = cls.FromString(payload)
        except DecodeError:
            continue
        if _scrub_credentials(msg):
            return msg.SerializeToString()
    return payload


def _redact_json_text(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (_all_strings(v) if k in _JSON_ARGS_KEYS
                    else marker(v) if isinstance(v, str) and k in _JSON_CONTENT_KEYS else _redact_json_text(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_json_text(v) for v in value]
    return value


def _all_strings(value: Any) -> Any:
    """Every string under an arguments or result key hidden: structured tool arguments and results
    (``"args": {"command": "…"}``) are content as much as a plain ``"text"`` is; keys stay."""
    return map_leaves(value, _marked)


def _marked(value: Any) -> Any:
    return marker(value) if isinstance(value, str) else value


def redact_blob(data: bytes) -> bytes:
    """A KV blob with its content hidden: JSON prompt blobs keep their shape, others become a marker."""
    if not data:
        return data
    head = data[:1].lstrip()
    if head in (b"{", b"["):
        try:
            doc = load_json(data)
        except ValueError:  # not JSON, or nested past the limit: the marker below
            pass
        else:
            return json.dumps(_redact_json_text(doc), ensure_ascii=False).encode()
    return marker(data).encode()


def _scrub_content(msg: Message) -> bool:
    changed = False
    for fd, value in msg.ListFields():
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            vfd = map_value_field(fd)
            if vfd is not None and vfd.type != FieldDescriptor.TYPE_MESSAGE and is_content_field(fd.name):
                for k in list(value.keys()):
                    v = value[k]
                    if v:
                        value[k] = marker(v).encode() if isinstance(v, bytes) else marker(v)
                        changed = True
            for v in submessages(fd, value):
                changed |= _scrub_content(v)
            continue
        if fd.type not in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES) or not is_content_field(fd.name):
            continue
        if fd.is_repeated:
            new = [_content_value(fd, v) for v in value]
            del value[:]
            value.extend(new)
        else:
            setattr(msg, fd.name, _content_value(fd, value))
        changed = True
    return changed


def _content_value(fd: FieldDescriptor, value: str | bytes) -> str | bytes:
    if fd.type == FieldDescriptor.TYPE_BYTES:
        assert isinstance(value, bytes)
        return redact_blob(value) if fd.name == "blob_data" else marker(value).encode()
    return marker(value)


def redact_payload(payload: bytes, msg_type: str | None, *, content: bool = False) -> bytes:
    """The stored form of one message: credentials always hidden; content too when asked.

    Returns ``payload`` itself (same object) when nothing needed hiding, so frames without secrets
    stay byte-identical to the wire.
    """
    if not payload or (payload[:1] == b"[" and is_marker(payload.decode("latin-1"))):
        return payload
    if msg_type in SECRET_MESSAGE_TYPES:
        return marker(payload).encode()
    if msg_type is None:
        return marker(payload).encode() if content else payload
    if not content and not may_carry_credentials(payload, msg_type):
        return payload
    cls = _class(msg_type)
    if cls is None:
        return marker(payload).encode() if content else payload
    try:
        msg = cls.FromString(payload)
    except DecodeError:
        return marker(payload).encode() if content else payload
    changed = _scrub_credentials(msg)
    if content:
        changed |= _scrub_content(msg)
    return msg.SerializeToString() if changed else payload


def _parse_wrapper(msg_type: str, raw: bytes) -> Any | None:
    cls = _class(msg_type)
    if cls is None:
        return None
    try:
        return cls.FromString(raw)
    except DecodeError:
        return None


def rewrap_append(raw: bytes, new_inner: bytes) -> bytes:
    """A BidiAppendRequest carrying ``new_inner`` in place of its data (hex field 1 or raw field 4).

    A gRPC-Web append kept with its envelope (``raw`` = 5-byte header + request) is rebuilt with
    the same envelope flags (gzipped again when flag 0x01 was set).
    """
    envs = split_unary(raw)
    if len(envs) == 1 and envs[0].enveloped and envs[0].flags >= 0 and envs[0].error is None:
        env = envs[0]
        inner = rewrap_append(env.payload, new_inner)
        return encode(inner, env.flags & ~FLAG_COMPRESSED, compress=bool(env.flags & FLAG_COMPRESSED))
    req = _parse_wrapper(_BIDI_APPEND, raw)
    if req is None:
        return marker(raw).encode()
    if req.data_bytes:
        req.data_bytes = new_inner
    else:
        req.data = binascii.hexlify(new_inner).decode()
    return bytes(req.SerializeToString())


def rewrap_poll(raw: bytes, new_inner: bytes) -> bytes:
    """A BidiPollResponse carrying ``new_inner`` (base64) in place of its data."""
    resp = _parse_wrapper(_BIDI_POLL_RESP, raw)
    if resp is None:
        return marker(raw).encode()
    resp.data = base64.b64encode(new_inner).decode()
    return bytes(resp.SerializeToString())


# JSON keys of OpenAI-compatible bodies whose string values are credentials (compared with ``_`` and
# ``-`` removed, lower case): a client or bridge may send a provider key in the body
# (``api_key``, ``apiKey``, LiteLLM's ``api_key`` per model, ``extra_body`` secrets).
_JSON_SECRET_KEYS = frozenset({"apikey", "authorization", "password", "secret", "token", "accesstoken",
                               "refreshtoken", "clientsecret", "bearertoken", "sessiontoken", "idtoken",
                               "xapikey", "openaiapikey", "anthropicapikey"})
# ... and whose string values are content (prompts, answers, tool arguments and results)
_OPENAI_CONTENT_KEYS = frozenset({"content", "text", "arguments", "delta", "input", "instructions", "output",
                                  "reasoning_content", "reasoning", "refusal", "prompt", "system", "summary"})


def _json_secret_key(key: str) -> bool:
    k = key.replace("_", "").replace("-", "").lower()
    return k in _JSON_SECRET_KEYS or k.endswith(("apikey", "secret", "password"))


def _redact_openai_doc(value: Any, content: bool) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(v, str) and not is_marker(v) and (
                    _json_secret_key(k) or (content and k in _OPENAI_CONTENT_KEYS)):
                v = marker(v)
            elif isinstance(v, dict | list):
                v = _redact_openai_doc(v, content)
            out[k] = v
        return out
    if isinstance(value, list):
        return [_redact_openai_doc(v, content) for v in value]
    return value


# A JSON string token (unrolled: no backtracking per character) and what may follow a key
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_COLON = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")


def _token_text(token: bytes) -> str:
    try:
        value = json.loads(token)
    except ValueError:
        return token[1:-1].decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def scrub_json_secrets(data: bytes) -> bytes:
    """Credential keys' string values as markers in JSON text that is not parsed (nested past the
    nesting limit, or cut): a scan of its string tokens, linear and without recursion. Every ``"``
    outside a string opens one, so in well-formed JSON each key is seen as a key whatever its depth."""
    out: list[bytes] = []
    pos = start = 0
    find, match = data.find, _JSON_STRING.match
    while (i := find(b'"', pos)) >= 0:
        m = match(data, i)
        if m is None:
            break
        pos = m.end()
        colon = _COLON.match(data, pos)
        if colon is None or data[colon.end():colon.end() + 1] != b'"':
            continue
        if not _json_secret_key(_token_text(m.group())):  # (an escaped key is decoded before it is judged)
            continue
        value = match(data, colon.end())
        if value is None:  # the text ends inside the credential: none of it is kept
            out += (data[start:colon.end()], json.dumps(marker(data[colon.end():])).encode())
            start = pos = len(data)
            break
        text = _token_text(value.group())
        if not is_marker(text):
            out += (data[start:value.start()], json.dumps(marker(text)).encode())
            start = value.end()
        pos = value.end()
    if not out:
        return data
    out.append(data[start:])
    return b"".join(out)


def redact_openai(frame: Frame, *, content: bool = False) -> Frame:
    """An OpenAI-side frame (``openai.*``, ``workbench.decode.openai``) as it may be stored: credential
    keys in its JSON always become markers, content keys too with ``content``. A request body
    that is not JSON (or nested past ``workbench.nesting``'s limit) cannot be searched reliably and
    is stored as its marker (idempotent: a marker stays); any other such payload keeps its bytes
    with the string values of credential keys scrubbed (``scrub_json_secrets``)."""
    data = frame.payload
    if not data or frame.kind in (kinds.OPENAI_DONE, kinds.OPENAI_COMMENT):
        return frame
    try:
        doc = load_json(data)
    except ValueError:  # not JSON, not UTF-8, or nested too deeply to parse
        text = data.decode("utf-8", "replace")
        if (frame.kind == kinds.OPENAI_REQUEST or content) and not is_marker(text):
            frame.payload = marker(data).encode()
            frame.summary = f"{frame.kind}: unparsable body stored as a hash"
        elif not is_marker(text):
            frame.payload = scrub_json_secrets(data)
        return frame
    new = _redact_openai_doc(doc, content)
    if new != doc:
        frame.payload = json.dumps(new, ensure_ascii=False, separators=(",", ":")).encode()
        if content:
            frame.summary = f"{frame.kind} (content redacted)"
    return frame


def redact_frame(frame: Frame, *, content: bool = False, decoder: Decoder | None = None) -> Frame:
    """The frame as it may be stored: payload (and the wrapper kept in ``raw``) redacted in place.

    With ``content`` the summary is recomputed from the redacted payload, since summaries quote
    prompts and commands.
    """
    if frame.kind == "malformed":
        if content:
            frame.payload = marker(frame.payload).encode() if frame.payload else frame.payload
            frame.raw = marker(frame.raw).encode() if frame.raw else frame.raw
            frame.summary = "malformed (content redacted)"
        return frame
    if kinds.is_end_stream(frame.kind):
        return frame
    if kinds.is_openai(frame.kind):
        return redact_openai(frame, content=content)
    new = redact_payload(frame.payload, frame.msg_type, content=content)
    if new is frame.payload:
        return frame
    frame.payload = new
    if frame.raw:
        if frame.append_seqno is not None and frame.msg_type == _CLIENT_MSG:
            frame.raw = rewrap_append(frame.raw, new)
        elif frame.msg_type == _SERVER_MSG:
            frame.raw = rewrap_poll(frame.raw, new)
        else:
            frame.raw = marker(frame.raw).encode()
    if content:
        dec = decoder
        if dec is None:
            # deferred: as in _class, the decoder is loaded only when content is redacted
            from workbench.decode.classify import default_decoder

            dec = default_decoder()
        if frame.msg_type in (_CLIENT_MSG, _SERVER_MSG):
            frame.summary = dec.classify_agent(new, frame.msg_type).summary
        else:
            frame.summary = f"{frame.kind} (content redacted)"
    return frame
