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
