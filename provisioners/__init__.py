"""Cloud provisioners: one contract, and adapters for the local simulated cloud, SkyPilot, AWS, GCP
and Azure. Cloud SDKs are imported only inside their adapter. It must not import orchestrator/ or
runtime/.
"""
