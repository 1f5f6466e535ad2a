"""Request bodies as msgspec Structs: one typed decode turns bad JSON or wrong types into a 400 that
names the field. The same Structs generate the OpenAPI schemas (openapi.py), so docs and checks agree.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

from omni.api.decode_errors import decode_refusal
from omni.api.errors import ApiError
from omni.sampling import MaxTokens, SamplingFields

LogitBias = Annotated[dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]], Meta(max_length=1024)]
ChatAudioFormat = Literal["wav", "pcm16", "flac", "mp3", "opus", "aac"]
MAX_CHOICES = 16  # `n`: answers to one request
SpeechFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]


class TextPart(Struct, tag="text", tag_field="type"):
    text: str


class ImageUrl(Struct):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(Struct, tag="image_url", tag_field="type"):
    image_url: ImageUrl


class InputAudio(Struct):
    data: str
    format: Literal["wav", "mp3", "flac", "ogg", "webm", "m4a", "mp4", "aac", "opus"]  # a hint: the bytes decide


class AudioPart(Struct, tag="input_audio", tag_field="type"):
    input_audio: InputAudio


class VideoUrl(Struct):
    url: str  # a data URL (data:video/mp4;base64,...) or an allow-listed http(s) URL, as image_url's


class VideoPart(Struct, tag="video_url", tag_field="type"):
    """vLLM's name and shape for a video in chat: {"type": "video_url", "video_url": {"url": ...}}."""

    video_url: VideoUrl


ContentPart = Union[TextPart, ImagePart, AudioPart, VideoPart]


class MmProcessorKwargs(Struct, forbid_unknown_fields=True):
    """vLLM's `mm_processor_kwargs`, of which omni takes only what changes a request's inputs."""

    use_audio_in_video: bool = False  # the videos' audio tracks are heard too, interleaved in time
    fps: Annotated[float, Meta(gt=0, le=60)] | None = None  # frames sampled per second of video (the model's own)
    do_sample_frames: bool | None = None  # Qwen's docs send true; false (every frame) is not served


class Message(Struct):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    token_ids: list[int] | None = None  # omni: an assistant answer's ids as generated, used instead of its text


class ChatAudioOptions(Struct):
    voice: str
    format: ChatAudioFormat = "wav"


class StreamOptions(Struct):
    include_usage: bool = False


class StageSampling(SamplingFields, forbid_unknown_fields=True):
    """omni's extension: sampling for any autoregressive stage, e.g. `talker`."""


class ChatCompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/chat/completions: OpenAI's fields, the sampling ones (SamplingFields) among them."""

    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    modalities: Annotated[list[Literal["text", "audio"]], Meta(min_length=1)] | None = None
    audio: ChatAudioOptions | None = None
    logit_bias: LogitBias | None = None  # OpenAI's: token id (as a string) -> bias in [-100, 100]
    max_completion_tokens: MaxTokens | None = None
    stop: Union[str, Annotated[list[str], Meta(max_length=16)], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] = 1
    stage_sampling: dict[str, StageSampling] | None = None
    user: str | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    mm_processor_kwargs: MmProcessorKwargs | None = None  # vLLM's; {"use_audio_in_video": true}
    # OpenAI parameters omni does not serve yet: decoded so that a request using one is refused
    # with a 400 naming it (`UNSERVED_CHAT_FIELDS`), never silently answered without it
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    prediction: Any = None


class CompletionRequest(SamplingFields, kw_only=True):
    """POST /v1/completions (OpenAI's legacy text completions, as vLLM serves them): the prompt is
    continued as it is, without the chat template; the sampling fields are SamplingFields'."""

    model: str
    prompt: Union[str, Annotated[list[Any], Meta(min_length=1, max_length=MAX_CHOICES)]]
    max_tokens: MaxTokens | None = 16  # OpenAI's default (SamplingFields' own, redefined)
    logit_bias: LogitBias | None = None
    stop: Union[str, Annotated[list[str], Meta(max_length=16)], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] = 1
    echo: bool = False
    stage_sampling: dict[str, StageSampling] | None = None
    user: str | None = None
    # OpenAI parameters not served here: refused with a 400 naming them (UNSERVED_COMPLETION_FIELDS)
    best_of: Any = None
    logprobs: Any = None
    suffix: Any = None


UNSERVED_COMPLETION_FIELDS: dict[str, tuple] = {"best_of": (1,), "logprobs": (), "suffix": ("",)}


# field -> what a request may set it to and still be served (None: any value is refused)
UNSERVED_CHAT_FIELDS: dict[str, tuple] = {
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "parallel_tool_calls": (True, False), "response_format": ({"type": "text"},), "prediction": (),
}


class VoiceId(Struct, forbid_unknown_fields=True):
    """OpenAI's form of a custom voice in `voice`: {"id": "voice_..."}."""

    id: str


class SpeechRequest(Struct):
    model: str
    input: Annotated[str, Meta(min_length=1, max_length=4096)]
    voice: str | VoiceId  # a speaker's name, or (a model that clones voices) an uploaded voice's name or id
    response_format: SpeechFormat = "mp3"
    speed: Annotated[float, Meta(ge=0.25, le=4.0)] = 1.0
    stream_format: Literal["audio", "sse"] = "audio"
    stream: bool = False  # omni's: wav streamed as made (0xFFFFFFFF sizes, as OpenAI's); else sent whole, sized
    instructions: str | None = None
    stage_sampling: dict[str, StageSampling] | None = None
    # an inline reference clip for a model that clones voices (vLLM-Omni's names); `voice` is then ignored
    ref_audio: str | None = None  # base64 or a data URL of an audio file
    ref_text: str | None = None  # its transcript
    x_vector_only_mode: bool | None = None  # clone from the speaker embedding only (no transcript needed)


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct):
    error: ErrorDetail


TRANSCRIPTION_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")

_decoders: dict[type, msgspec.json.Decoder] = {}


def decode_body(body: bytes, cls: type) -> object:
    """Decode a JSON body into `cls`; every failure is a 400 naming the field (`messages[0].role`)."""
    decoder = _decoders.get(cls)
    if decoder is None:
        decoder = _decoders[cls] = msgspec.json.Decoder(cls)
    if not body.strip():
        raise ApiError(400, "request body is empty; expected a JSON object", code="invalid_json")
    try:
        return decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:  # in the client's words (decode_errors.py)
        raise decode_refusal(exc, body, cls) from None
    except RecursionError:  # msgspec recurses per nesting level, also through fields it skips
        raise ApiError(400, "body is not valid JSON: it is nested too deeply", code="invalid_json") from None
