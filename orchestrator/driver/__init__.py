"""The driver: a job's loop from plan to finished model (machine.py) with its real collaborators
(world.py: market + planner, provisioner, runtime), its persisted state (state.py), its event log
(events.py), and the runner that ties them to a recipe on the local cloud (job.py)."""
