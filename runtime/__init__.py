"""The training runtime: Ray actor groups that run pipeline stages and data-parallel replicas.

It receives a Layout and knows nothing of planning or clouds (see ../shared/DESIGN.md). It must not
import orchestrator/ or provisioners/.
"""
