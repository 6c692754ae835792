"""``workbench.security.origin``: which Host, Origin and key a local workbench server accepts.

The servers (proxy, live read service, replay, web) all ask ``AccessPolicy.refusal``; their own
tests check the wiring over HTTP. Here: the decision itself, with the requests a browser under a
DNS-rebinding or cross-origin attack sends, and what a non-browser client sends."""

from __future__ import annotations

import pytest

from workbench.security.origin import LOOPBACK_ONLY, AccessPolicy, host_name, is_loopback


@pytest.mark.parametrize(("value", "name"), [
    ("127.0.0.1:8080", "127.0.0.1"), ("LOCALHOST", "localhost"), ("[::1]:443", "::1"), ("[::1]", "::1"),
    ("example.com.", "example.com"), ("::1", "::1"), (" Evil.Example:80 ", "evil.example"),
])
def test_host_name_drops_port_brackets_case_and_the_final_dot(value: str, name: str) -> None:
    assert host_name(value) == name


@pytest.mark.parametrize("host", ["localhost", "app.localhost", "127.0.0.1", "127.8.9.10:1234", "[::1]:80",
                                  "::ffff:127.0.0.1", "localhost."])
def test_loopback_names_and_addresses(host: str) -> None:
    assert is_loopback(host)
    assert LOOPBACK_ONLY.refusal("GET", {"host": host}) is None


@pytest.mark.parametrize("host", ["evil.example", "localhost.evil.example", "10.0.0.1", "[::2]", "0.0.0.0",
                                  "127.0.0.1.nip.io"])
def test_a_rebinding_host_is_refused_and_the_message_says_how_to_allow_it(host: str) -> None:
    assert not is_loopback(host)
    status, reason = LOOPBACK_ONLY.refusal("GET", {"host": host}) or (0, "")
    assert status == 403
    assert f"--allow-host {host_name(host)}" in reason


def test_http2_authority_counts_as_host() -> None:
    assert LOOPBACK_ONLY.refusal("POST", {":authority": "evil.example:443"}) is not None
    assert LOOPBACK_ONLY.refusal("POST", {":authority": "127.0.0.1:443"}) is None


def test_a_specific_bind_address_is_a_host_a_wildcard_bind_is_not() -> None:
    lan = AccessPolicy.build(bind_host="192.168.1.20")
    assert lan.refusal("GET", {"host": "192.168.1.20:9000"}) is None
    wildcard = AccessPolicy.build(bind_host="0.0.0.0")
    assert wildcard.refusal("GET", {"host": "0.0.0.0:9000"}) is not None
    assert wildcard.refusal("GET", {"host": "192.168.1.20"}) is not None
    named = AccessPolicy.build(bind_host="box.lan", allow_hosts=["Other.Example:8080", " "])
    assert named.allow_hosts == frozenset({"box.lan", "other.example"})
    assert AccessPolicy.build(allow_hosts=["*"]).refusal("GET", {"host": "anything.example"}) is None


def test_a_web_page_origin_is_refused_unless_allowed() -> None:
    page = {"host": "127.0.0.1:9000", "origin": "https://evil.example"}
    status, reason = LOOPBACK_ONLY.refusal("POST", page) or (0, "")
    assert status == 403 and "--allow-origin https://evil.example" in reason
    allowed = AccessPolicy.build(allow_origins=["HTTPS://Evil.Example/"])
    assert allowed.refusal("POST", page) is None
    assert allowed.refusal("POST", {**page, "origin": "https://other.example"}) is not None
    # a page served by the workbench itself is still an Origin: only the allow-list lets it in
    assert LOOPBACK_ONLY.refusal("POST", {**page, "origin": "http://127.0.0.1:9000"}) is not None
    # curl, the OpenAI SDK and our readers send no Origin
    assert LOOPBACK_ONLY.refusal("POST", {"host": "127.0.0.1:9000"}) is None


def test_cors_preflight_is_always_refused() -> None:
    everyone = AccessPolicy.build(allow_origins=["*"], allow_hosts=["*"])
    preflight = {"host": "127.0.0.1", "origin": "https://a.example", "access-control-request-method": "POST"}
    status, reason = everyone.refusal("options", preflight) or (0, "")
    assert status == 403 and "preflight" in reason
    assert everyone.refusal("OPTIONS", {"host": "127.0.0.1", "origin": "https://a.example"}) is None


@pytest.mark.parametrize(("authorization", "ok"), [
    ("Bearer s3cret-key", True), ("bearer  s3cret-key ", True), ("Bearer s3cret-keyX", False),
    ("Basic s3cret-key", False), ("s3cret-key", False), (None, False),
])
def test_the_api_key_must_come_as_a_bearer_token(authorization: str | None, ok: bool) -> None:
    policy = AccessPolicy.build(api_key="s3cret-key")
    headers = {"host": "127.0.0.1"} | ({"authorization": authorization} if authorization is not None else {})
    refusal = policy.refusal("POST", headers)
    assert (refusal is None) is ok
    if refusal is not None:
        assert refusal[0] == 401 and "s3cret" not in refusal[1]  # the message never echoes a key
    assert AccessPolicy.build(api_key="").api_key is None  # an empty key is no key


def test_host_is_checked_before_the_key() -> None:
    policy = AccessPolicy.build(api_key="k")
    assert (policy.refusal("GET", {"host": "evil.example", "authorization": "Bearer k"}) or (0,))[0] == 403
