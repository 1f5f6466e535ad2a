"""The request params contract of Qwen3-Omni's stages: the omni families' shared one (omni/stages/multimodal/request.py)."""

from omni.stages.multimodal.request import (ENCODE, SPEECH_INSTRUCTION, TASKS, TRANSCRIBE_INSTRUCTION, chat_messages,
                                      check_voice, completion_text, needs, prompt_chars, voice_of, wants_audio)

__all__ = ["ENCODE", "SPEECH_INSTRUCTION", "TASKS", "TRANSCRIBE_INSTRUCTION", "chat_messages", "check_voice",
           "completion_text", "needs", "prompt_chars", "voice_of", "wants_audio"]
