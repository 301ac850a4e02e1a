"""The driver: a job's loop from plan to finished model (machine.py) with its real collaborators
(world.py: market + planner, provisioner, runtime), its persisted state (state.py), its event log
(events.py); a job's run from its folder and lock (job.py) on its world (local.py: the local
simulated cloud), the driver put together in its actor (assembly.py, actor.py), the local cloud's
chaos (chaos.py), the per-step metrics (metrics.py) and the status rows people read (status.py)."""
