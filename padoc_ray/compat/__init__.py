"""Compatibility helpers for environments that lack pieces of the usual stack (for example a CPU-only venv without torchvision)."""
