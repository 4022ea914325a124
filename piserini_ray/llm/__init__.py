"""LLM calls through litellm (`client`) with one classified retry policy (`retry`) under one
limiter (`limiter`). Import the modules themselves: this package imports nothing, so a process
that only needs the limiter (its Ray actor) never loads litellm."""
