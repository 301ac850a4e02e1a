"""The driver: a job's loop from plan to finished model (machine.py), its persisted state
(state.py) and its event log (events.py)."""
