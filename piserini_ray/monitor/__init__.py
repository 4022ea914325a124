"""Watching runs while they go on (docs/guides/monitoring.md): each run's live status file
(`status.py`: `status.json`, read by `piserini-ray status` and stale when its driver is gone),
the driver's board that writes it from the store's events and carries a stop request
(`board.py`), and the live web view (`web.py`, `piserini-ray watch`)."""
