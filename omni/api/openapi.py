"""The OpenAPI 3.1 document for every route. Request schemas come from the msgspec Structs the routes
decode with, so the document cannot drift from what the server accepts.
"""

from __future__ import annotations

import copy
from functools import lru_cache

import msgspec

from omni.api.schemas import (TRANSCRIPTION_FORMATS, ChatCompletionRequest, CompletionRequest, ErrorResponse,
                              SpeechRequest)

_REF = "#/components/schemas/{name}"


@lru_cache(maxsize=1)
def _components() -> dict:
    (_, components) = msgspec.json.schema_components([ChatCompletionRequest, CompletionRequest, SpeechRequest,
                                                      ErrorResponse],
                                                     ref_template=_REF)
    return components


def _errors(*statuses: int) -> dict:
    what = {400: "invalid request", 401: "missing or bad API key", 404: "unknown model or route",
            409: "a voice of that name exists", 413: "body or media over the limits", 429: "admission full; retry later",
            503: "a needed stage is down, or the server is draining", 504: "deadline exceeded"}
    ref = {"$ref": _REF.format(name="ErrorResponse")}
    return {str(s): {"description": what[s], "content": {"application/json": {"schema": ref}}} for s in statuses}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_OBJ = {"type": "object"}
_CHAT_OK = {"type": "object", "required": ["id", "object", "choices"],
            "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                           "choices": {"type": "array"}, "usage": {"type": "object"}}}
_VOICE = {"type": "object", "required": ["id", "object", "name"]}
_VOICE_FORM = {"type": "object", "required": ["name", "audio_sample"],
               "properties": {"name": {"type": "string"}, "audio_sample": {"type": "string", "format": "binary"},
                              "ref_text": {"type": "string", "description": "the clip's transcript (none: the "
                                                                            "voice is cloned from its speaker "
                                                                            "embedding only)"},
                              "consent": {"type": "string"}}}
_TRANSCRIBE_FORM = {
    "type": "object",
    "required": ["file", "model"],
    "properties": {
        "file": {"type": "string", "contentMediaType": "application/octet-stream",
                 "description": "audio file: wav, flac, ogg, mp3, webm, m4a or mp4 audio"},
        "model": {"type": "string"},
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string", "enum": list(TRANSCRIPTION_FORMATS)},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "stream": {"type": "string", "enum": ["true", "false"],
                   "description": "SSE transcript.text.delta events, then transcript.text.done (json / text only)"},
        "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["segment", "word"]},
                                      "description": "with verbose_json: segments (default) and/or words"},
    },
}


def build_openapi(voices: list[str] | None = None, models: list[str] | None = None) -> dict:
    """The document for one server; `models` / `voices` narrow the schemas to what it serves."""
    components = copy.deepcopy(_components())
    if models:
        for name in ("ChatCompletionRequest", "CompletionRequest", "SpeechRequest"):
            components[name]["properties"]["model"] = {"type": "string", "enum": list(models)}
    components["SpeechRequest"]["properties"]["voice"]["description"] = (
        "the model's speaker, case-insensitive" + (f"; one of: {', '.join(voices)}" if voices else ""))
    form = copy.deepcopy(_TRANSCRIBE_FORM)
    if models:
        form["properties"]["model"] = {"type": "string", "enum": list(models)}
    audio_types = ["audio/wav", "audio/pcm", "audio/flac", "audio/mpeg", "audio/ogg", "audio/aac"]
    translate_form = copy.deepcopy(form)
    del translate_form["properties"]["language"]
    text_ok = {"description": "json / verbose_json object, or text / srt / vtt, or with stream=true SSE events",
               "content": {"application/json": {"schema": _OBJ},
                           "text/plain": {"schema": {"type": "string"}},
                           "text/vtt": {"schema": {"type": "string"}},
                           "text/event-stream": {"schema": {"type": "string"}}}}
    speech_ok = {"description": "audio bytes as they are made (stream_format audio), or SSE events "
                                "speech.audio.delta / speech.audio.done (stream_format sse)",
                 "content": {**{t: {"schema": {"type": "string", "contentMediaType": t}} for t in audio_types},
                             "text/event-stream": {"schema": {"type": "string"}}}}
    chat_ok = {"description": "a chat.completion, or with stream=true SSE chat.completion.chunk events "
                              "ending with [DONE]",
               "content": {"application/json": {"schema": _CHAT_OK},
                           "text/event-stream": {"schema": {"type": "string"}}}}
    paths = {
        "/v1/chat/completions": {"post": {
            "operationId": "createChatCompletion",
            "summary": "Chat with text, audio and image inputs; text and speech outputs",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": _REF.format(name="ChatCompletionRequest")}}}},
            "responses": {"200": chat_ok, **_errors(400, 401, 404, 413, 429, 503, 504)}}},
        "/v1/completions": {"post": {
            "operationId": "createCompletion",
            "summary": "Continue a raw prompt (no chat template), text out",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": _REF.format(name="CompletionRequest")}}}},
            "responses": {"200": {**chat_ok, "description": "a text_completion, or with stream=true SSE events "
                                                            "ending with [DONE]"},
                          **_errors(400, 401, 404, 413, 429, 503, 504)}}},
        "/v1/audio/speech": {"post": {
            "operationId": "createSpeech",
            "summary": "Text to speech, streamed",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": _REF.format(name="SpeechRequest")}}}},
            "responses": {"200": speech_ok, **_errors(400, 401, 404, 413, 429, 503, 504)}}},
        "/v1/audio/transcriptions": {"post": {
            "operationId": "createTranscription",
            "summary": "Speech to text (served only by a model that transcribes)",
            "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": form}}},
            "responses": {"200": text_ok, **_errors(400, 401, 404, 413, 429, 503, 504)}}},
        "/v1/audio/translations": {"post": {
            "operationId": "createTranslation",
            "summary": "Speech in any language to English text (served only by a model that translates)",
            "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": translate_form}}},
            "responses": {"200": text_ok, **_errors(400, 401, 404, 413, 429, 503, 504)}}},
        "/v1/audio/voices": {
            "get": {"operationId": "listVoices", "summary": "The model's voices and the uploaded ones",
                    "responses": {"200": _json({"type": "object", "required": ["object", "data", "voices"]},
                                               "voice list"), **_errors(401)}},
            "post": {"operationId": "createVoice",
                     "summary": "Upload a voice to clone (a model that clones voices): a clip, its transcript, a name",
                     "requestBody": {"required": True, "content": {
                         "multipart/form-data": {"schema": _VOICE_FORM},
                         "application/json": {"schema": {**_VOICE_FORM, "properties": {
                             **_VOICE_FORM["properties"], "audio_sample": {"type": "string", "description":
                                                                             "base64 or a data URL"}}}}}},
                     "responses": {"200": _json(_VOICE, "the voice"), **_errors(400, 401, 404, 409, 413, 429, 503,
                                                                                  504)}}},
        "/v1/audio/voices/{voice_id}": {"delete": {
            "operationId": "deleteVoice", "summary": "Delete an uploaded voice (by id or name)",
            "parameters": [{"name": "voice_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": _json({"type": "object", "required": ["id", "deleted"]}, "deleted"),
                          **_errors(400, 401, 404)}}},
        "/v1/models": {"get": {
            "operationId": "listModels", "summary": "The served model",
            "responses": {"200": _json({"type": "object", "required": ["object", "data"]}, "model list"),
                          **_errors(401)}}},
        "/v1/models/{model}": {"get": {
            "operationId": "retrieveModel", "summary": "One served model",
            "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": _json({"type": "object", "required": ["id", "object"]}, "the model"),
                          **_errors(401, 404)}}},
        "/health": {"get": {
            "operationId": "health", "summary": "200 only when every stage answers a probe",
            "responses": {"200": _json(_OBJ, "every stage answered"), **_errors(503)}}},
        "/metrics": {"get": {
            "operationId": "metrics", "summary": "Prometheus metrics",
            "responses": {"200": {"description": "Prometheus text format",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/openapi.json": {"get": {
            "operationId": "openapi", "summary": "This document",
            "responses": {"200": _json(_OBJ, "OpenAPI 3.1 document")}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "omnid", "version": "1", "description": "omni's OpenAI-compatible API"},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
