"""Emulated clouds that really boot: a cloud's API served locally (moto's server for EC2) and
every instance it starts booted as a namespace VM on the job's simulated internet from its own
boot script, with the cloud's metadata service inside it. The real SDK clients and our adapters
run unchanged against them (docs/bootstrap.md)."""
