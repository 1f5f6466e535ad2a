"""A body msgspec refuses gets OpenAI's wording: the field by its JSON path, what was expected and
sent, and one code per mistake whatever the route (decode_errors.py). No msgspec phrasing leaks."""

from __future__ import annotations

import pytest

from omni.api.errors import ApiError
from omni.api.schemas import ChatCompletionRequest, CompletionRequest, SpeechRequest, decode_body

HI = '"messages": [{"role": "user", "content": "hi"}]'
CHAT = {
    "missing model": ('{%s}' % HI, "missing_field", "model", "Missing required parameter: 'model'."),
    "missing role": ('{"model": "m", "messages": [{"content": "hi"}]}', "missing_field", "messages[0].role",
                     "Missing required parameter: 'messages[0].role'."),
    "n=0": ('{"model": "m", %s, "n": 0}' % HI, "invalid_value", "n",
            "Invalid 'n': expected an integer >= 1, but got 0 instead."),
    "n too many": ('{"model": "m", %s, "n": 17}' % HI, "invalid_value", "n",
                   "Invalid 'n': expected an integer <= 16, but got 17 instead."),
    "a list body": ("[1, 2]", "invalid_type", None,
                    "Invalid type for the request body: expected a JSON object, but got an array instead."),
    "a string body": ('"hello"', "invalid_type", None,
                      "Invalid type for the request body: expected a JSON object, but got a string instead."),
    "n a string": ('{"model": "m", %s, "n": "2"}' % HI, "invalid_type", "n",
                   "Invalid type for 'n': expected an integer, but got a string instead."),
    "no messages": ('{"model": "m", "messages": []}', "invalid_value", "messages",
                    "Invalid 'messages': expected an array with at least 1 item, but got 0."),
    "bad role": ('{"model": "m", "messages": [{"role": "bot"}]}', "invalid_value", "messages[0].role",
                 "Invalid value for 'messages[0].role': 'bot'. Supported values are: 'system', 'developer', "
                 "'user', 'assistant'."),
    "bad part type": ('{"model": "m", "messages": [{"role": "user", "content": [{"type": "video"}]}]}',
                      "invalid_value", "messages[0].content[0].type",
                      "Invalid value for 'messages[0].content[0].type': 'video'. Supported values are: 'text', "
                      "'image_url', 'input_audio', 'video_url'."),
    "unknown stage field": ('{"model": "m", %s, "stage_sampling": {"a": {"top_k": 1}, "talker": {"warmth": 1}}}'
                            % HI, "unknown_parameter", "stage_sampling.talker.warmth",
                            "Unrecognized request argument supplied: 'stage_sampling.talker.warmth'."),
    "logit bias out of range": ('{"model": "m", %s, "logit_bias": {"12": 500}}' % HI, "invalid_value",
                                "logit_bias.12", "Invalid 'logit_bias.12': expected a number <= 100.0, "
                                                 "but got 500 instead."),
    "not json": ('{"model": "m", "messages": [', "invalid_json", None, "body is not valid JSON: Input data was truncated"),
}


def refusal(body: str, cls: type) -> ApiError:
    with pytest.raises(ApiError) as refused:
        decode_body(body.encode(), cls)
    assert refused.value.status == 400 and refused.value.type == "invalid_request_error"
    return refused.value


@pytest.mark.parametrize("name", list(CHAT))
def test_chat_body_refusals_in_openais_words(name):
    body, code, param, message = CHAT[name]
    err = refusal(body, ChatCompletionRequest)
    assert (err.code, err.param, err.message) == (code, param, message)
    assert "`" not in err.message and "$." not in err.message  # no msgspec phrasing


def test_the_same_mistake_has_the_same_code_on_every_route():
    """A missing required field is `missing_field` naming the field on chat, completions and speech."""
    got = {(e.code, e.param) for e in (refusal('{"messages": [{"role": "user"}]}', ChatCompletionRequest),
                                       refusal('{"prompt": "x"}', CompletionRequest),
                                       refusal('{"input": "x", "voice": "alloy"}', SpeechRequest))}
    assert got == {("missing_field", "model")}
    speech = refusal('{"model": "tts-1", "input": "x"}', SpeechRequest)
    assert (speech.code, speech.param, speech.message) == ("missing_field", "voice",
                                                           "Missing required parameter: 'voice'.")
    fmt = refusal('{"model": "tts-1", "input": "x", "voice": "alloy", "response_format": "ogg"}', SpeechRequest)
    assert fmt.message == ("Invalid value for 'response_format': 'ogg'. Supported values are: 'wav', 'pcm', "
                           "'flac', 'mp3', 'opus', 'aac'.")
    many = refusal('{"model": "m", "prompt": "x", "n": 0}', CompletionRequest)
    assert (many.code, many.param) == ("invalid_value", "n")
