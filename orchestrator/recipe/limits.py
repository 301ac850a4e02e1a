"""The largest values a recipe or plan may hold: every number finite and below a maximum, every
text and list bounded, so that no input makes the planner, the simulator or the runtime loop for
ever or overflow. docs/recipe.md lists them; the schemas (schema.py, plan.py) attach them to their
fields as ``most`` (the largest number, for a list each item's), ``items`` (the longest list) and
``chars`` (the longest text); the binder checks them before anything else looks at a value.

The lower bounds (``lr > 0``, ``steps >= 1``, ...) are checked with the other value rules in
checks.py, so that every such problem of a recipe is reported together.
"""

from __future__ import annotations

MAX_TEXT_CHARS = 4096  # a path or a name; PATH_MAX on Linux
MAX_LIST_ITEMS = 1024  # any list the schema does not bound more tightly

MAX_GLOBAL_BATCH_SIZE = 2**20  # samples per step: GPT-3 took 1,536 (3.2M tokens)
MAX_STEPS = 10**9
MAX_SEED = 2**32 - 1  # numpy's seeding takes 0 .. 2**32 - 1 (torch takes more)
MAX_LR = 10.0
MAX_WEIGHT_DECAY = 10.0
MAX_GRAD_CLIP_NORM = 1e6
MAX_MICROBATCH_SIZES = 64  # microbatch sizes to choose from

MAX_USD_PER_HOUR = 1e7
MAX_USD = 1e12
MAX_SAMPLES_PER_S = 1e12
MAX_DEADLINE_H = 1e6  # a century is 876,000 hours

MAX_GPUS = 10**6  # in one job
MAX_LOCATIONS = 1024  # places to allow, exclude or spread over
MAX_GPU_TYPES = 64
MAX_PIPELINE_STAGES = 10_000  # no built-in model has more layers
MAX_TENSOR_PARALLEL = 16  # TP stays in one node; checks.py also wants a power of two

MAX_KEEP_CHECKPOINTS = 1000
MAX_RECOVERY_ATTEMPTS = 10_000  # recoveries in a row without progress
MAX_RECOVERY_S = 30 * 24 * 3600.0  # a month
MAX_BACKOFF_S = 24 * 3600.0
MAX_STREAMS = 256
MAX_NOTICE_S = 3600.0
MAX_SLOW_NODES = 10_000
MAX_SLOWDOWN = 1000.0
MAX_PREEMPTIONS = 1024  # steps listed for each kind of simulated preemption

# plans
MAX_PLAN_STAGES = MAX_PIPELINE_STAGES
MAX_PLAN_REPLICAS = 65_536  # data-parallel replicas of one stage
MAX_LAYER_INDEX = 100_000
