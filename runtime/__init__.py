"""The training runtime: Ray actor groups that run pipeline stages and data-parallel replicas.

It receives a Layout and knows nothing of planning or clouds (see ../shared/DESIGN.md); by the
import rules it depends on neither the orchestrator package nor the provisioners package.
"""
