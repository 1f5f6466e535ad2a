"""Schemathesis against omnid's own /openapi.json: generated requests (valid and not) never get a
5xx, and responses match the documented statuses, content types and schemas."""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from omni.api.app import ServerConfig
from omni.api.openapi import build_openapi
from test_api_support import LiveServer

MODELS = ["omni-demo", "gpt-4o", "gpt-4o-mini", "gpt-4o-audio-preview", "gpt-4o-mini-audio-preview",  # + OpenAI's
          "gpt-realtime", "gpt-realtime-mini", "gpt-4o-realtime-preview", "gpt-4o-mini-realtime-preview",  # names of
          "tts-1", "tts-1-hd", "gpt-4o-mini-tts"]  # its tasks
schema = schemathesis.openapi.from_dict(build_openapi(voices=["tone"], models=MODELS))


@pytest.fixture(scope="module")
def server():
    with LiveServer(mode="inline", config=ServerConfig(port=0, request_timeout_s=10.0)) as srv:
        yield srv


def test_served_document_is_the_one_under_test(server):
    served = requests.get(server.url + "/openapi.json", timeout=10).json()
    assert served == schema.raw_schema


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
def test_generated_requests(case, server):
    # positive_data_acceptance is left out: a schema-valid body can still carry media that is not
    # media (random base64 that is no audio file, a data URL that is no image): that is a 400
    case.call_and_validate(base_url=server.url, excluded_checks=[positive_data_acceptance], timeout=30)
