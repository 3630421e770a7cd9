"""Settings that were removed still load when they ask for nothing, and refuse clearly when
they ask for what no longer exists."""

import pytest

from sidecar.config import ConfigError, load_settings

UPSTREAM = {"LLM_SIDECAR_UPSTREAM": "http://127.0.0.1:8000"}


@pytest.mark.parametrize("value", ["false", "False", "0"])
def test_inject_stream_usage_false_still_loads(value):
    settings = load_settings({}, environ={**UPSTREAM, "LLM_SIDECAR_INJECT_STREAM_USAGE": value})
    assert settings.inject_stream_usage is False


def test_inject_stream_usage_true_is_refused_by_name():
    with pytest.raises(ConfigError) as err:
        load_settings({}, environ={**UPSTREAM, "LLM_SIDECAR_INJECT_STREAM_USAGE": "true"})
    assert "inject_stream_usage" in str(err.value) and "never rewrites" in str(err.value)
