"""OpenAI's Realtime API over WebSocket (`/v1/realtime`): session settings, the conversation, the
input audio buffer with server voice detection (silero-vad), and responses streamed from the kernel.

route.py (the socket, dialects) -> session.py (events, state) -> response.py (one kernel request),
with config.py (session settings), conversation.py (items), transcripts.py (Whisper for a model that
does not hear), audio_buffer.py and vad.py.
"""
