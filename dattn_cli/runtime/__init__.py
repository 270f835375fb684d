"""How work is run: the one launcher of process groups, isolated measurement workers, limits, timers and
memory probes, and the facts of the environment a report records."""
