"""A kiln fit callback that writes the same event times as the peer jobs (bench_peers.py
adds it to kiln's job with ``+callbacks.peers_events._target_=kiln_events.Events``)."""

from __future__ import annotations

from peer_common import event


class Events:
    """``fit_start`` (the first step begins), each validation's start and end, ``fit_end``."""

    def on_fit_start(self) -> None:
        event("fit_start")

    def on_validation_start(self) -> None:
        event("validation_start")

    def on_validation_end(self) -> None:
        event("validation_end")

    def on_fit_end(self) -> None:
        event("fit_end")
