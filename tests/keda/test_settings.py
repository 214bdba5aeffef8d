"""The KEDA gRPC port setting: from the environment, off, or a clear error."""

from __future__ import annotations

import pytest

from predictive_scaler.controller.settings import (
    DEFAULT_KEDA_PORT,
    ENV_KEDA_PORT,
    ControllerSettings,
)
from predictive_scaler.errors import ConfigError

BASE = {"PREDICTIVE_SCALER_PROMETHEUS_URL": "http://prometheus:9090", "PREDICTIVE_SCALER_MODEL_STORE": "/models"}


@pytest.mark.parametrize(("value", "port"), [
    (None, DEFAULT_KEDA_PORT), ("", DEFAULT_KEDA_PORT), ("7000", 7000), ("off", None), ("OFF", None), ("0", 0),
], ids=["unset", "empty", "port", "off", "off-upper", "any-free"])
def test_keda_port_from_the_environment(value: str | None, port: int | None) -> None:
    env = dict(BASE) if value is None else {**BASE, ENV_KEDA_PORT: value}
    assert ControllerSettings.from_env(env).keda_port == port


@pytest.mark.parametrize("value", ["six", "6000.5", "70000", "-1"], ids=["text", "fraction", "too-big", "negative"])
def test_a_bad_keda_port_says_what_to_write(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        ControllerSettings.from_env({**BASE, ENV_KEDA_PORT: value})
    assert info.value.field in (ENV_KEDA_PORT, "keda_port")


@pytest.mark.parametrize(("value", "only"), [(None, False), ("", False), ("true", True), ("TRUE", True),
                                             ("false", False)])
def test_keda_only_from_the_environment(value: str | None, only: bool) -> None:
    env = dict(BASE) if value is None else {**BASE, "PREDICTIVE_SCALER_KEDA_ONLY": value}
    assert ControllerSettings.from_env(env).keda_only is only


def test_keda_only_needs_the_port_and_a_plain_word() -> None:
    with pytest.raises(ConfigError, match="is not true or false"):
        ControllerSettings.from_env({**BASE, "PREDICTIVE_SCALER_KEDA_ONLY": "yes"})
    with pytest.raises(ConfigError, match="PREDICTIVE_SCALER_KEDA_PORT is off"):
        ControllerSettings.from_env({**BASE, "PREDICTIVE_SCALER_KEDA_ONLY": "true", ENV_KEDA_PORT: "off"})


def test_the_flags_reach_the_settings() -> None:
    import argparse

    from predictive_scaler.commands import controller

    parser = argparse.ArgumentParser()
    controller.register(parser.add_subparsers())
    args = parser.parse_args(["controller", "--keda-only", "--keda-tls-cert", "/t/tls.crt", "--keda-tls-key",
                              "/t/tls.key", "--keda-tls-client-ca", "/t/ca.crt"])
    settings = controller.settings_from_args(args, BASE)
    assert settings.keda_only and (settings.keda_tls_cert, settings.keda_tls_key, settings.keda_tls_client_ca) == (
        "/t/tls.crt", "/t/tls.key", "/t/ca.crt")
    assert not controller.settings_from_args(parser.parse_args(["controller"]), BASE).keda_only
