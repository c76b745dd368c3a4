"""What a run costs and where it ran: step times (``step_timer.py``), compilation
(``compile_watch.py``), FLOPs and MFU (``flops.py``), memory (``memory.py``), the machine and
its load (``machine.py``), and the progress shown while it trains (``progress.py``).

Nothing is imported here: each module is imported where it is used; the names the other
kiln packages use are exported by ``kiln.core``.
"""
