"""One bootstrap for every node of a job, on every provider (docs/bootstrap.md).

``script.render`` turns a ``NodeBoot`` into the script a VM runs at boot: install the controller's
versions, close the public interface to all but WireGuard, join the overlay with a one-use token,
``ray start`` on the overlay address with the node's labels and resources, then run the watcher
(``watcher.py``: peer sync, preemption notices, the dead-man switch). ``script.aws_user_data``,
``gcp_metadata``, ``azure_custom_data`` and ``skypilot_run`` wrap it for each provider.
"""
