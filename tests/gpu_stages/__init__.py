"""Tiny CUDA stages for the kernel's GPU tests (importable by stage processes: cwd is on sys.path)."""
