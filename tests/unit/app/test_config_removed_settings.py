"""A removed setting is gone from every source: refused as unknown, like any mistyped name, by
the YAML file, the environment and the command line; never advertised by ``serve --help``."""

import pytest

from sidecar.cli import main
from sidecar.config import ConfigError, Settings, load_settings

UPSTREAM = {"LLM_SIDECAR_UPSTREAM": "http://127.0.0.1:8000"}
REMOVED = ["inject_stream_usage"]


@pytest.mark.parametrize("name", REMOVED)
def test_the_model_has_no_removed_setting(name):
    assert name not in Settings.model_fields


@pytest.mark.parametrize("name", REMOVED)
def test_a_removed_key_in_the_file_is_an_unknown_setting(name, tmp_path):
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"{name}: false\n")
    with pytest.raises(ConfigError) as err:
        load_settings({}, environ=UPSTREAM, config_file=str(config))
    assert str(err.value).startswith(f"unknown setting {name!r} in --config {config}")


@pytest.mark.parametrize("name", REMOVED)
def test_a_removed_variable_is_an_unknown_environment_variable(name):
    var = f"LLM_SIDECAR_{name.upper()}"
    with pytest.raises(ConfigError) as err:
        load_settings({}, environ={**UPSTREAM, var: "false"})
    assert str(err.value).startswith(f"unknown environment variable {var}")


@pytest.mark.parametrize("name", REMOVED)
def test_a_removed_flag_is_unrecognized_and_not_in_the_help(name, capsys):
    option = "--" + name.replace("_", "-")
    # A bad --listen too: were the flag still taken, the start stops there (a config error,
    # not argparse's), never a server left running.
    with pytest.raises(SystemExit) as done:
        main(["serve", "--upstream", "http://127.0.0.1:8000", "--listen", "bad", option, "false"])
    assert done.value.code == 2
    assert f"unrecognized arguments: {option} false" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert option not in capsys.readouterr().out
