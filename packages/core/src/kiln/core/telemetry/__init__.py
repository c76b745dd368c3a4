"""What a run costs and where it ran: step times (``step_timer.py``), compilation
(``compile_watch.py``), FLOPs and MFU (``flops.py``), memory (``memory.py``), the machine and
its load (``machine.py``), and the progress shown while it trains (``progress.py``).

Nothing is imported here: import a name from its module (``kiln.core`` exports only what
a user of ``fit`` needs).
"""
