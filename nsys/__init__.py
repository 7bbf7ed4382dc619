"""Trace scripts: torch-profiler capture, Nsight Systems wrapper, GPU gap summarizer."""
