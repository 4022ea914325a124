"""Every peer harness's files in one place, read and written.

Read (`piserini-ray import`): `peer_files` finds and parses BrowseComp-Plus's and Pi-Serini's
run files as their own readers do; `peer_usage` maps each harness's token counts by their
meaning; `peer_settings` reads what a run's files state about its model and retriever;
`importer` turns them into a run directory of ours (`imported` notes where it came from).

Written (`piserini-ray export`): `peer_writers` writes a run in each peer's format (their run
files, evaluation summary, qrels and TREC runs); `exporter` picks the writer of a format.
"""
