"""Retry classification of the failures the data stages meet, produced by the real libraries where possible."""

from __future__ import annotations

import pytest

from tasks.retry import is_transient


def test_an_unreachable_hub_is_a_transient_network_failure():
    """A real huggingface_hub call to an endpoint that refuses connections (httpx2's ConnectError, not an
    OSError) is retried, as a network failure is."""
    from huggingface_hub import HfApi

    with pytest.raises(Exception) as info:
        HfApi(endpoint="http://127.0.0.1:9").dataset_info("HuggingFaceFW/fineweb")
    assert not isinstance(info.value, OSError)
    assert is_transient(info.value)


@pytest.mark.parametrize("module", ["httpx", "httpx2"])
def test_http_client_timeouts_and_dropped_connections_are_transient_and_protocol_misuse_is_not(module):
    lib = pytest.importorskip(module)
    assert is_transient(lib.ReadTimeout("read timed out"))
    assert is_transient(lib.RemoteProtocolError("server disconnected"))
    assert not is_transient(lib.UnsupportedProtocol("unknown scheme"))


def test_source_not_found_is_not_transient(tmp_path):
    from data.fineweb import SourceNotFound, parse_source

    with pytest.raises(SourceNotFound) as info:
        parse_source(str(tmp_path / "missing"))
    assert not is_transient(info.value)
