"""The parts of `piserini-ray import` (`importer.py`) per concern: `files` reads the peers' run
files as their own readers find and parse them; `usage` maps each harness's token counts by
their meaning; `settings` reads what a run's files state about its model and retriever."""
