"""Payload channels: how arrays move between stage actors (inline frames, shm arena, CUDA IPC)."""
