"""rlhf-lab: RLHF experiments (reward models, PPO, DPO) on a world with a known gold reward."""

import time

__version__ = "0.1.0"
STARTED = time.time()  # when the package was first imported: about the process's start (a job's time/startup_s)
