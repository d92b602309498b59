"""The one orchestrator: the commands as library calls (``commands``), stage 1 for them
(``loading``), the runs of many parts (``parts``, ``compute_parts``, ``follow``), the Ray engine
and the values stage 3 attaches to each row."""
