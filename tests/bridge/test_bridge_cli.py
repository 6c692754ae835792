"""``workbench capture --bridge``: what a bridge URL may be (a clear error naming the option)."""

from __future__ import annotations

import pytest

from workbench.capture.cli import _bridge_listeners
from workbench.errors import CliError


@pytest.mark.parametrize(("url", "says"), [
    ("ftp://127.0.0.1:4141", "give the bridge's base URL"),
    ("127.0.0.1:4141", "give the bridge's base URL"),
    ("http://127.0.0.1:4141/v1", "origin only"),
    ("http://127.0.0.1:port", "--bridge http://127.0.0.1:port"),
])
def test_bad_bridge_url_is_a_usage_error(url: str, says: str) -> None:
    with pytest.raises(CliError) as err:
        _bridge_listeners([url], "127.0.0.1")
    assert says in str(err.value) and url in str(err.value)


def test_each_bridge_gets_its_own_listener() -> None:
    got = _bridge_listeners(["http://127.0.0.1:4141", "https://bridge.local:8443/"], "127.0.0.1")
    assert [t for t, _ in got] == ["http://127.0.0.1:4141", "https://bridge.local:8443"]
    assert len({p for _, p in got}) == 2 and all(p > 0 for _, p in got)
