"""The `kb` command line: the top of the house. It imports every layer below it (harness, kb stores,
indexer, diagnose) and nothing imports it. Heavy layers (torch, triton, chromadb, llama-index) are
imported inside commands, so `kb --help` stays instant.

One module per family of commands, each on the group in `cli.app`; importing them here registers them."""

from cli import agent_host, bench, diagnose, embedder, evaluate, imports, index, optimize, query, run  # noqa: F401 - registers
from cli.app import main

__all__ = ["main"]
